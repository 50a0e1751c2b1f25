package netpol

import (
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// TableName is the one table the node owns in every namespace it manages,
// in the inet family so IPv4 and IPv6 meet the same chains.
const TableName = "kibotos"

// CounterDenied is the named counter every policy drop increments, so the
// node can report denied connections per Workspace without parsing rules.
const CounterDenied = "denied"

// Table is a generated rule table, or one read back from a namespace: what
// Replace writes, what Inspect compares and what String renders. Fields
// marked "read back only" are empty in a generated table.
type Table struct {
	Family nftables.TableFamily
	Name   string
	// Flags are the kernel's table flags, dormant or owner (read back only).
	Flags uint32
	// Comment is the table's UserData comment: the marker naming it ours.
	Comment string
	// Counters are the named counter objects, sorted.
	Counters []string
	// Objects are stateful objects that are not counters (read back only:
	// the node never writes one).
	Objects []Object
	Sets    []*Set
	Chains  []*Chain
}

// Object is a stateful object found in a table besides its counters.
type Object struct {
	Name string
	Type nftables.ObjType
}

// Set is a named set of address ranges of one family. Every set of
// configured addresses the node writes is an interval set of ipv4_addr or
// ipv6_addr, so a prefix and a range cost one element; a learned set
// (flags timeout) holds single addresses that expire, which the node's
// resolver adds at run time.
type Set struct {
	Name string
	// Comment is the set's UserData comment: the marker naming it ours.
	Comment string
	// KeyType and Flags (NFT_SET_*) describe the set as the kernel holds
	// it; a set of another shape is not one the node wrote.
	KeyType nftables.SetDatatype
	Flags   uint32
	// Ranges are the elements, merged and sorted.
	Ranges []addrRange
	// elemErr says why the elements of a set read back could not be
	// decoded as address ranges.
	elemErr string
	// id ties lookups to the set inside one batch (the kernel resolves a
	// set created in the same transaction by id); assigned by Build.
	id uint32
}

// Chain is a chain with its rules in order: a base chain on a hook, or a
// regular chain that rules jump to.
type Chain struct {
	Name     string
	Type     nftables.ChainType
	Hook     nftables.ChainHook
	Priority nftables.ChainPriority
	Policy   nftables.ChainPolicy
	// Device is the interface of an ingress chain.
	Device string
	// Comment is the chain's UserData comment: the marker naming it ours.
	Comment string
	Rules   []*Rule
	// regular marks a chain without a hook; then Type, Hook, Priority and
	// Policy mean nothing.
	regular bool
}

// Rule is one rule: its expressions and the comment that names it.
type Rule struct {
	// Comment is the rule's UserData comment: a marker for ours.
	Comment string
	// UserData is the raw UserData when it holds more than a comment
	// (read back only).
	UserData []byte
	Exprs    []expr.Any
	// Handle is the kernel's handle (read back only).
	Handle uint64
	// undecoded names the expressions of a rule read back that have no
	// type here (read back only): such a rule is never one of ours.
	undecoded []string
}

// learned says whether s is filled at run time (Learn), not by Build.
func (s *Set) learned() bool { return s.Flags&unix.NFT_SET_TIMEOUT != 0 }

// chain returns the chain named name, or nil.
func (t *Table) chain(name string) *Chain {
	for _, c := range t.Chains {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// set returns the set named name, or nil.
func (t *Table) set(name string) *Set {
	for _, s := range t.Sets {
		if s.Name == name {
			return s
		}
	}
	return nil
}
