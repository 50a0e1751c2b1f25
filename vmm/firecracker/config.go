package firecracker

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
)

// The types below carry the JSON names of Firecracker's API definitions
// (swagger: BootSource, MachineConfiguration, Drive, NetworkInterface,
// Vsock); VMConfig is the subset of FullVmConfiguration that kibotos uses,
// which is also the document --config-file reads.

// BootSource is PUT /boot-source and the "boot-source" section.
type BootSource struct {
	KernelImagePath string `json:"kernel_image_path"`
	InitrdPath      string `json:"initrd_path,omitempty"`
	BootArgs        string `json:"boot_args,omitempty"`
}

// MachineConfig is PUT /machine-config and the "machine-config" section.
type MachineConfig struct {
	VCPUCount  int  `json:"vcpu_count"`
	MemSizeMiB int  `json:"mem_size_mib"`
	SMT        bool `json:"smt,omitempty"`
}

// Drive is PUT /drives/{drive_id} and one element of "drives" (a
// virtio-block drive; vhost-user fields are not used).
type Drive struct {
	DriveID      string `json:"drive_id"`
	PathOnHost   string `json:"path_on_host"`
	IsRootDevice bool   `json:"is_root_device"`
	IsReadOnly   bool   `json:"is_read_only"`
}

// NetworkInterface is PUT /network-interfaces/{iface_id} and one element
// of "network-interfaces".
type NetworkInterface struct {
	IfaceID     string `json:"iface_id"`
	HostDevName string `json:"host_dev_name"`
	GuestMAC    string `json:"guest_mac,omitempty"`
}

// Vsock is PUT /vsock and the "vsock" section. Firecracker creates and
// listens on UDSPath once the VM starts; host-initiated connections go
// through it with the CONNECT handshake (see DialVsock).
type Vsock struct {
	GuestCID uint32 `json:"guest_cid"`
	UDSPath  string `json:"uds_path"`
}

// VMConfig is the --config-file document: with it Firecracker configures
// and starts the VM with no API call (and still serves the API socket for
// later control unless --no-api is given).
type VMConfig struct {
	BootSource        BootSource         `json:"boot-source"`
	MachineConfig     MachineConfig      `json:"machine-config"`
	Drives            []Drive            `json:"drives"`
	NetworkInterfaces []NetworkInterface `json:"network-interfaces"`
	Vsock             *Vsock             `json:"vsock,omitempty"`
}

var (
	deviceIDRE = regexp.MustCompile(`^[A-Za-z0-9_]{1,64}$`)
	macRE      = regexp.MustCompile(`^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$`)
)

// MaxVCPUs is the documented upper bound of vcpu_count.
const MaxVCPUs = 32

// Validate checks what the API documents as required or bounded, so a bad
// Instance fails here and not inside a VMM that has no operator watching.
func (c *VMConfig) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.BootSource.KernelImagePath == "" {
		bad("boot-source: kernel_image_path is required")
	}
	if n := c.MachineConfig.VCPUCount; n < 1 || n > MaxVCPUs {
		bad("machine-config: vcpu_count %d: want 1 to %d", n, MaxVCPUs)
	} else if c.MachineConfig.SMT && n != 1 && n%2 != 0 {
		bad("machine-config: vcpu_count %d with smt: want 1 or an even number", n)
	}
	if c.MachineConfig.MemSizeMiB < 1 {
		bad("machine-config: mem_size_mib %d: want at least 1", c.MachineConfig.MemSizeMiB)
	}
	ids, roots := map[string]bool{}, 0
	for _, d := range c.Drives {
		if !deviceIDRE.MatchString(d.DriveID) {
			bad("drive %q: drive_id wants 1 to 64 letters, digits or '_'", d.DriveID)
		}
		if ids[d.DriveID] {
			bad("drive %q: drive_id given twice", d.DriveID)
		}
		ids[d.DriveID] = true
		if d.PathOnHost == "" {
			bad("drive %q: path_on_host is required", d.DriveID)
		}
		if d.IsRootDevice {
			roots++
		}
	}
	if roots > 1 {
		bad("drives: %d root devices, at most one allowed", roots)
	}
	ifaces := map[string]bool{}
	for _, n := range c.NetworkInterfaces {
		if !deviceIDRE.MatchString(n.IfaceID) {
			bad("network interface %q: iface_id wants 1 to 64 letters, digits or '_'", n.IfaceID)
		}
		if ifaces[n.IfaceID] {
			bad("network interface %q: iface_id given twice", n.IfaceID)
		}
		ifaces[n.IfaceID] = true
		if n.HostDevName == "" {
			bad("network interface %q: host_dev_name is required", n.IfaceID)
		}
		if n.GuestMAC != "" && !macRE.MatchString(n.GuestMAC) {
			bad("network interface %q: guest_mac %q is not a MAC address", n.IfaceID, n.GuestMAC)
		}
	}
	if v := c.Vsock; v != nil {
		if v.GuestCID < 3 {
			bad("vsock: guest_cid %d: want at least 3 (0-2 are reserved)", v.GuestCID)
		}
		if v.UDSPath == "" {
			bad("vsock: uds_path is required")
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("firecracker config: %w", errors.Join(errs...))
	}
	return nil
}

// JSON is the validated --config-file content, indented, newline-terminated.
// Empty device lists are written as [] (the documented shape), never null.
func (c *VMConfig) JSON() ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	cc := *c
	if cc.Drives == nil {
		cc.Drives = []Drive{}
	}
	if cc.NetworkInterfaces == nil {
		cc.NetworkInterfaces = []NetworkInterface{}
	}
	b, err := json.MarshalIndent(&cc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
