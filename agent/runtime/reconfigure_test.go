package runtime

import (
	"strings"
	"testing"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// What a restarted guest is told again is what it was told, in order: a
// later hostname wins, a mount at a target replaces the earlier one there
// and comes after the others (a Volume remounted grown, say).
func TestMergeConfigured(t *testing.T) {
	root := guestproto.Mount{Source: "serial:layer", Target: "/rootfs", FSType: "ext4"}
	data := guestproto.Mount{Source: "serial:vol-1", Target: "/rootfs/data", FSType: "ext4"}
	grown := data
	grown.Options = []string{guestproto.MountOptGrow}
	c := mergeConfigured(nil, guestproto.ConfigureRequest{Hostname: "a", Mounts: []guestproto.Mount{root, data}})
	c = mergeConfigured(c, guestproto.ConfigureRequest{Hostname: "b"})
	c = mergeConfigured(c, guestproto.ConfigureRequest{Mounts: []guestproto.Mount{grown}})
	if c.Hostname != "b" || len(c.Mounts) != 2 || c.Mounts[0].Target != "/rootfs" || len(c.Mounts[1].Options) != 1 {
		t.Fatalf("merged %+v", c)
	}
}

// A configuration read from a snapshot (a shared pool holds it) is
// bounded and checked before a guest is told it.
func TestCheckConfigured(t *testing.T) {
	many := make([]guestproto.Mount, maxConfiguredMounts+1)
	for i := range many {
		many[i] = guestproto.Mount{Source: "tmpfs", Target: "/m"}
	}
	for _, tc := range []struct {
		c    *guestproto.ConfigureRequest
		want string
	}{
		{nil, ""},
		{&guestproto.ConfigureRequest{Hostname: "ws-1", Mounts: []guestproto.Mount{{Source: "proc", Target: "/rootfs/proc"}}}, ""},
		{&guestproto.ConfigureRequest{DNS: []string{"10.0.0.1"}}, "holds a network"},
		{&guestproto.ConfigureRequest{Hostname: strings.Repeat("h", 65)}, "is not one"},
		{&guestproto.ConfigureRequest{Hostname: "a/b"}, "is not one"},
		{&guestproto.ConfigureRequest{Mounts: many}, "over 256"},
		{&guestproto.ConfigureRequest{Mounts: []guestproto.Mount{{Source: "tmpfs", Target: "rel"}}}, "is not one a guest is told"},
		{&guestproto.ConfigureRequest{Mounts: []guestproto.Mount{{Source: "tmpfs", Target: "/a/../b"}}}, "is not one a guest is told"},
		{&guestproto.ConfigureRequest{Mounts: []guestproto.Mount{{Target: "/a"}}}, "is not one a guest is told"},
	} {
		err := checkConfigured(tc.c)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("checkConfigured(%+v) = %v; want %q", tc.c, err, tc.want)
		}
	}
}
