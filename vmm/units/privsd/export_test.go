package privsd

import "context"

// StartWithoutDeathSignal starts a private systemd tied to this process
// but without the parent-death signal: what is left when the kernel does
// not end it with its starter.
func StartWithoutDeathSignal(ctx context.Context, dir string) (*Instance, error) {
	return StartWith(ctx, dir, Options{noDeathSignal: true})
}
