package netpol

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// DeniedCount reads the namespace's denied counter: the packets its table
// dropped by policy since the last Replace (a Replace starts it at zero).
func DeniedCount(nsFD int) (packets, bytes uint64, err error) {
	c, err := nftables.New(nftables.WithNetNSFd(nsFD))
	if err != nil {
		return 0, 0, fmt.Errorf("netpol: namespace fd %d: counter %s: %w", nsFD, CounterDenied, err)
	}
	o, err := c.GetObject(&nftables.NamedObj{
		Table: &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName},
		Name:  CounterDenied,
		Type:  nftables.ObjTypeCounter,
	})
	if err != nil {
		return 0, 0, fmt.Errorf("netpol: namespace fd %d: counter %s: %w", nsFD, CounterDenied, err)
	}
	no, ok := o.(*nftables.NamedObj)
	if !ok {
		return 0, 0, fmt.Errorf("netpol: namespace fd %d: counter %s: read back as %T", nsFD, CounterDenied, o)
	}
	ctr, ok := no.Obj.(*expr.Counter)
	if !ok {
		return 0, 0, fmt.Errorf("netpol: namespace fd %d: counter %s: object holds %T", nsFD, CounterDenied, no.Obj)
	}
	return ctr.Packets, ctr.Bytes, nil
}
