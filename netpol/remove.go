package netpol

import (
	"context"
	"fmt"

	"github.com/google/nftables"
)

// RemoveHost deletes the node's own table from the node's namespace, for a
// node that runs no Instance any more and goes away (kibotos dev down);
// none is fine.
func RemoveHost(ctx context.Context, nsFD int) error {
	c, err := dial(ctx, nsFD)
	if err != nil {
		return fmt.Errorf("netpol: namespace fd %d: remove table %s: %w", nsFD, TableName, err)
	}
	nt := &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
	c.AddTable(nt) // makes the delete valid when there is none
	c.DelTable(nt)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("netpol: namespace fd %d: remove table %s: %w", nsFD, TableName, err)
	}
	return nil
}
