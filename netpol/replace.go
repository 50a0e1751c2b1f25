package netpol

import (
	"context"
	"fmt"
)

// Replace puts t in place of the namespace's table of the same name in one
// transaction: the old table's deletion and the new table's creation
// commit together or not at all, so no packet ever meets a namespace
// without rules, and a batch the kernel refuses leaves the old table as it
// was. Conntrack entries are not part of a table, so established
// connections survive. Counters start again from zero.
func Replace(ctx context.Context, nsFD int, t *Table) error {
	var x txn
	err := x.dropTable(t.Family, t.Name)
	if err == nil {
		err = x.addTable(t)
	}
	if err != nil {
		return fmt.Errorf("netpol: namespace fd %d: replace table %s: %w", nsFD, t.Name, err)
	}
	if err := x.commit(ctx, nsFD); err != nil {
		return fmt.Errorf("netpol: namespace fd %d: replace table %s (old table kept): %w", nsFD, t.Name, err)
	}
	return nil
}
