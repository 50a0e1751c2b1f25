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
	var x txn
	if err := x.dropTable(nftables.TableFamilyINet, TableName); err != nil {
		return fmt.Errorf("netpol: namespace fd %d: remove table %s: %w", nsFD, TableName, err)
	}
	if err := x.commit(ctx, nsFD); err != nil {
		return fmt.Errorf("netpol: namespace fd %d: remove table %s: %w", nsFD, TableName, err)
	}
	return nil
}
