package firecracker

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

type apiCall struct {
	Method, Path, ContentType string
	Body                      map[string]any
}

// fakeAPI is an httptest server on a unix socket that records every call
// and answers with respond (204 by default).
type fakeAPI struct {
	socket  string
	mu      sync.Mutex
	calls   []apiCall
	respond func(w http.ResponseWriter, r *http.Request) bool
}

func newFakeAPI(t *testing.T) *fakeAPI {
	t.Helper()
	f := &fakeAPI{socket: filepath.Join(t.TempDir(), "api.sock")}
	l, err := net.Listen("unix", f.socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := apiCall{Method: r.Method, Path: r.URL.EscapedPath(), ContentType: r.Header.Get("Content-Type")}
		b, _ := io.ReadAll(r.Body)
		if len(b) > 0 {
			if err := json.Unmarshal(b, &c.Body); err != nil {
				t.Errorf("%s %s: body is not a JSON object: %q", r.Method, r.URL.Path, b)
			}
		}
		f.mu.Lock()
		f.calls = append(f.calls, c)
		respond := f.respond
		f.mu.Unlock()
		if respond != nil && respond(w, r) {
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	return f
}

func (f *fakeAPI) takeCalls() []apiCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestAPIPuts(t *testing.T) {
	f := newFakeAPI(t)
	c := NewClient(f.socket)
	ctx := ctxT(t)
	steps := []struct {
		do   func() error
		want apiCall
	}{
		{func() error {
			return c.PutBootSource(ctx, BootSource{KernelImagePath: "/vmlinux", InitrdPath: "/initrd", BootArgs: "console=ttyS0"})
		}, apiCall{"PUT", "/boot-source", "application/json", map[string]any{"kernel_image_path": "/vmlinux", "initrd_path": "/initrd", "boot_args": "console=ttyS0"}}},
		{func() error { return c.PutMachineConfig(ctx, MachineConfig{VCPUCount: 2, MemSizeMiB: 256}) },
			apiCall{"PUT", "/machine-config", "application/json", map[string]any{"vcpu_count": 2.0, "mem_size_mib": 256.0}}},
		{func() error {
			return c.PutDrive(ctx, Drive{DriveID: "rootfs", PathOnHost: "/rootfs.ext4", IsRootDevice: true, IsReadOnly: true})
		}, apiCall{"PUT", "/drives/rootfs", "application/json", map[string]any{"drive_id": "rootfs", "path_on_host": "/rootfs.ext4", "is_root_device": true, "is_read_only": true}}},
		{func() error {
			return c.PutNetworkInterface(ctx, NetworkInterface{IfaceID: "eth0", HostDevName: "tap0", GuestMAC: "06:00:00:00:00:01"})
		}, apiCall{"PUT", "/network-interfaces/eth0", "application/json", map[string]any{"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "06:00:00:00:00:01"}}},
		{func() error { return c.PutVsock(ctx, Vsock{GuestCID: 3, UDSPath: "./v.sock"}) },
			apiCall{"PUT", "/vsock", "application/json", map[string]any{"guest_cid": 3.0, "uds_path": "./v.sock"}}},
		{func() error { return c.InstanceStart(ctx) },
			apiCall{"PUT", "/actions", "application/json", map[string]any{"action_type": "InstanceStart"}}},
		{func() error { return c.SendCtrlAltDel(ctx) },
			apiCall{"PUT", "/actions", "application/json", map[string]any{"action_type": "SendCtrlAltDel"}}},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s %s: %v", s.want.Method, s.want.Path, err)
		}
		got := f.takeCalls()
		if len(got) != 1 || !reflect.DeepEqual(got[0], s.want) {
			t.Errorf("calls %+v\nwant %+v", got, s.want)
		}
	}
}

func TestAPIRejectsBadDeviceIDs(t *testing.T) {
	f := newFakeAPI(t)
	c := NewClient(f.socket)
	if err := c.PutDrive(ctxT(t), Drive{DriveID: "../actions", PathOnHost: "/x"}); err == nil {
		t.Error("PutDrive sent a drive_id with a slash")
	}
	if err := c.PutNetworkInterface(ctxT(t), NetworkInterface{IfaceID: "", HostDevName: "tap0"}); err == nil {
		t.Error("PutNetworkInterface sent an empty iface_id")
	}
	if calls := f.takeCalls(); len(calls) != 0 {
		t.Errorf("calls reached the server: %+v", calls)
	}
}

func TestAPIDescribeInstance(t *testing.T) {
	f := newFakeAPI(t)
	f.respond = func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"app_name":"Firecracker","id":"web-1","state":"Running","vmm_version":"1.12.0"}`)
		return true
	}
	info, err := NewClient(f.socket).DescribeInstance(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if want := (InstanceInfo{AppName: "Firecracker", ID: "web-1", State: "Running", VMMVersion: "1.12.0"}); info != want {
		t.Errorf("info %+v", info)
	}
	if calls := f.takeCalls(); len(calls) != 1 || calls[0].Method != "GET" || calls[0].Path != "/" || calls[0].Body != nil {
		t.Errorf("calls %+v", calls)
	}
}

func TestAPIFaultMessage(t *testing.T) {
	f := newFakeAPI(t)
	f.respond = func(w http.ResponseWriter, r *http.Request) bool {
		switch r.URL.Path {
		case "/boot-source":
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"fault_message":"The kernel file cannot be opened: No such file or directory (os error 2)"}`)
		case "/actions":
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, "not json")
		default:
			return false
		}
		return true
	}
	c := NewClient(f.socket)
	err := c.PutBootSource(ctxT(t), BootSource{KernelImagePath: "/nope"})
	var ae *APIError
	if !errors.As(err, &ae) {
		t.Fatalf("error %v (%T), want *APIError", err, err)
	}
	if ae.Method != "PUT" || ae.Path != "/boot-source" || ae.StatusCode != 400 || !strings.HasPrefix(ae.FaultMessage, "The kernel file cannot be opened") {
		t.Errorf("APIError %+v", ae)
	}
	if want := "firecracker API PUT /boot-source: 400 Bad Request: The kernel file cannot be opened"; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error %q, want it to start %q", err, want)
	}
	err = c.InstanceStart(ctxT(t))
	if !errors.As(err, &ae) || ae.StatusCode != 500 || ae.FaultMessage != "not json" || ae.Path != "/actions" {
		t.Errorf("error %v", err)
	}
}

func TestAPIConfigureOrderAndStop(t *testing.T) {
	f := newFakeAPI(t)
	c := NewClient(f.socket)
	cfg, err := testBackend().VMConfig(testInstance(), testFiles("/i/web-1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Configure(ctxT(t), cfg); err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, call := range f.takeCalls() {
		paths = append(paths, call.Method+" "+call.Path)
	}
	want := []string{"PUT /machine-config", "PUT /boot-source", "PUT /drives/writable", "PUT /network-interfaces/eth0", "PUT /vsock"}
	if !reflect.DeepEqual(paths, want) {
		t.Errorf("calls %q\nwant %q", paths, want)
	}

	f.respond = func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path == "/drives/writable" {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"fault_message":"Unable to open the block device backing file"}`)
			return true
		}
		return false
	}
	err = c.Configure(ctxT(t), cfg)
	if err == nil || !strings.Contains(err.Error(), "PUT /drives/writable") {
		t.Errorf("error %v", err)
	}
	if n := len(f.takeCalls()); n != 3 {
		t.Errorf("%d calls, want 3 (stop at the failing drive)", n)
	}
}

func TestAPINoSocket(t *testing.T) {
	err := NewClient(filepath.Join(t.TempDir(), "none.sock")).SendCtrlAltDel(ctxT(t))
	if err == nil || !strings.Contains(err.Error(), "firecracker API PUT /actions on ") {
		t.Errorf("error %v", err)
	}
}
