package units

import "context"

// ServiceProperty reads one property of a unit's service as systemd has
// it, so tests check what the service manager applied, not what was sent.
func (m *Manager) ServiceProperty(ctx context.Context, unit, name string) (any, error) {
	p, err := m.conn.GetUnitTypePropertyContext(ctx, unit, "Service", name)
	if err != nil {
		return nil, err
	}
	return p.Value.Value(), nil
}
