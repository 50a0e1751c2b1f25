// Package arrows holds the test of the design's import rules (the arrows
// between packages that must never exist, docs/explanations or
// ARCHITECTURE's layout): the state machine knows no network, the node
// does not read the state machine, the protocol types import no server
// code, the VMM layer knows nothing of consensus, the leader's services
// (ctrl) know no server, the SDK links no server or CLI code. It has no
// code.
package arrows
