package runtime

import (
	"slices"
	"strings"

	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/platform"
)

// Warm guests: guests of a template booted ahead of any Workspace, so
// that a Workspace's first start adopts one instead of booting (a node's
// [templates.NAME] warm = N; resident.go keeps them). A warm guest boots
// with egress none and a new layer over the template image, and mounts
// what every Workspace of the template mounts the same way
// (WarmSpec.Mounts: the template's filesystem with /proc, /sys, /dev and
// resolv.conf in it), so that a start sends it no configure. Nothing of
// any Workspace is in it, and each start from one gives the guest a new
// identity (random state, hostname, machine id), as a fork's is.

// warmPrefix starts the Instance ids of warm guests (ctrl's start "inst-").
const warmPrefix = "warm-"

// IsWarm says whether an Instance is a warm guest, which no Workspace
// owns.
func IsWarm(id string) bool { return strings.HasPrefix(id, warmPrefix) }

// WarmKey is what a warm guest was made as; a start adopts only one of
// exactly the key it would boot.
type WarmKey struct {
	Template string `json:"template"`
	// TemplateID is the build of the template image (a rebuilt template
	// has a new id, and its warm guests saw the old image's blocks).
	TemplateID     string `json:"template_id"`
	InstallationID string `json:"installation_id"`
	VCPUs          int    `json:"vcpus"`
	MemoryMiB      int    `json:"memory_mib"`
}

// WarmSpec is a warm guest to make.
type WarmSpec struct {
	WarmKey
	Image        string // the template image
	Installation *platform.Installation
	// Mounts, when set, says what the warm guest mounts once it answers:
	// only what every Workspace of the template mounts the same way.
	Mounts func(guestproto.GuestInfo) []guestproto.Mount
}

// warmIdentity gives spec, the first start of a Workspace from warm
// guest w, a new identity (hostname, and a machine id in roots, where the
// guest has them mounted), and a configure without what the guest
// mounted already or the identity does.
func warmIdentity(spec *Spec, w Resident, hostname string, roots []string) {
	spec.Identity = &Identity{Hostname: hostname}
	for _, r := range roots {
		if w.Mounted(r) {
			spec.Identity.Roots = append(spec.Identity.Roots, r)
		}
	}
	mounts := w.Mounts
	if cfg := spec.Configure; cfg != nil {
		spec.Configure = func(g guestproto.GuestInfo) guestproto.ConfigureRequest {
			req := cfg(g)
			req.Mounts = slices.DeleteFunc(slices.Clone(req.Mounts), func(x guestproto.Mount) bool {
				return slices.ContainsFunc(mounts, func(y guestproto.Mount) bool { return sameMount(x, y) })
			})
			if req.Hostname == hostname {
				req.Hostname = "" // the identity sets it
			}
			return req
		}
	}
}

func sameMount(a, b guestproto.Mount) bool {
	return a.Source == b.Source && a.Target == b.Target && a.FSType == b.FSType && slices.Equal(a.Options, b.Options)
}
