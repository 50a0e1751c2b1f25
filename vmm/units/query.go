package units

import (
	"context"
	"encoding/hex"
	"fmt"
	"strings"
)

// Get reads the state of one unit. It returns an error wrapping ErrNotFound
// when the manager has no such unit (never started, or stopped and collected).
func (m *Manager) Get(ctx context.Context, name string) (Unit, error) {
	p, err := m.conn.GetUnitPropertiesContext(ctx, name)
	if err != nil {
		return Unit{}, fmt.Errorf("units: read unit %s: %w", name, err)
	}
	u := Unit{Name: name}
	u.LoadState, _ = p["LoadState"].(string)
	if u.LoadState == "not-found" || u.LoadState == "" {
		return Unit{}, fmt.Errorf("units: unit %s: %w", name, ErrNotFound)
	}
	u.Description, _ = p["Description"].(string)
	u.ActiveState, _ = p["ActiveState"].(string)
	u.SubState, _ = p["SubState"].(string)
	if id, ok := p["InvocationID"].([]byte); ok && len(id) > 0 {
		u.InvocationID = hex.EncodeToString(id)
	}
	typ := unitType(name)
	if typ == "" {
		return u, nil
	}
	tp, err := m.conn.GetUnitTypePropertiesContext(ctx, name, typ)
	if err != nil {
		return Unit{}, fmt.Errorf("units: read %s properties of unit %s: %w", typ, name, err)
	}
	u.ControlGroup, _ = tp["ControlGroup"].(string)
	u.Slice, _ = tp["Slice"].(string)
	if typ == "Service" {
		u.MainPID, _ = tp["MainPID"].(uint32)
		u.Result, _ = tp["Result"].(string)
		u.ExecMainStatus, _ = tp["ExecMainStatus"].(int32)
		u.OOMScoreAdjust, _ = tp["OOMScoreAdjust"].(int32)
		u.User, _ = tp["User"].(string)
		u.NoNewPrivileges, _ = tp["NoNewPrivileges"].(bool)
		u.MemoryMax, _ = tp["MemoryMax"].(uint64)
		u.TasksMax, _ = tp["TasksMax"].(uint64)
		u.LimitMEMLOCK, _ = tp["LimitMEMLOCK"].(uint64)
		u.CapabilityBoundingSet, _ = tp["CapabilityBoundingSet"].(uint64)
		u.ProtectSystem, _ = tp["ProtectSystem"].(string)
		u.ReadWritePaths, _ = tp["ReadWritePaths"].([]string)
		u.InaccessiblePaths, _ = tp["InaccessiblePaths"].([]string)
	}
	return u, nil
}

// List returns the loaded units whose names match the shell-style pattern
// (e.g. "kibotos-*"), in any state. Takeover uses it to find running VMMs.
func (m *Manager) List(ctx context.Context, pattern string) ([]Unit, error) {
	st, err := m.conn.ListUnitsByPatternsContext(ctx, nil, []string{pattern})
	if err != nil {
		return nil, fmt.Errorf("units: list units matching %q: %w", pattern, err)
	}
	out := make([]Unit, 0, len(st))
	for _, s := range st {
		u, err := m.Get(ctx, s.Name)
		if err != nil {
			if isNotFound(err) {
				continue // collected between the list and the read
			}
			return nil, err
		}
		out = append(out, u)
	}
	return out, nil
}

// unitType is the D-Bus interface suffix carrying ControlGroup for a unit name.
func unitType(name string) string {
	switch {
	case strings.HasSuffix(name, ".service"):
		return "Service"
	case strings.HasSuffix(name, ".scope"):
		return "Scope"
	case strings.HasSuffix(name, ".slice"):
		return "Slice"
	}
	return ""
}
