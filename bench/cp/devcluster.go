package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/internal/hostprobe"
)

func (b *bench) kibo(timeout time.Duration, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(b.bin, "kibo"), args...)
	cmd.Env = append(hostprobe.CleanEnv(), "KIBOTOS_DATA_DIR="+b.dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.Bytes(), err
}

func (b *bench) up() error {
	t0 := time.Now()
	b.bin = filepath.Join(b.tmp, "bin")
	b.dir = filepath.Join(b.tmp, "d")
	cmd := exec.Command("go", "build", "-o", filepath.Join(b.bin, "kibotos"), "github.com/kibotos/kibotos")
	if *kibotos != "" {
		cmd = exec.Command("cp", *kibotos, filepath.Join(b.bin, "kibotos"))
		os.MkdirAll(b.bin, 0o755)
	}
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build kibotos: %v\n%s", err, out)
	}
	if err := os.Symlink("kibotos", filepath.Join(b.bin, "kibo")); err != nil {
		return err
	}
	port, release, err := hostprobe.ReservePorts(4) // API, gossip, data plane, metrics
	if err != nil {
		return err
	}
	b.releasePorts = release
	b.addr = "127.0.0.1:" + strconv.Itoa(port)
	logf, err := os.Create(filepath.Join(b.tmp, "dev.log"))
	if err != nil {
		return err
	}
	b.dev = exec.Command(filepath.Join(b.bin, "kibotos"), "dev", "--data-dir", b.dir, "--advertise", b.addr,
		"--no-demo", "--platform-cache-dir", *cache)
	b.dev.Stdout, b.dev.Stderr, b.dev.Env = logf, logf, hostprobe.CleanEnv()
	b.dev.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := b.dev.Start(); err != nil {
		return err
	}
	b.devDone = make(chan struct{})
	go func() { b.dev.Wait(); logf.Close(); close(b.devDone) }()
	fmt.Printf("kibotos dev pid %d in %s\n", b.dev.Process.Pid, b.tmp)

	deadline := time.Now().Add(5 * time.Minute)
	for {
		select {
		case <-b.devDone:
			return fmt.Errorf("kibotos dev exited; see %s/dev.log", b.tmp)
		default:
		}
		out, err := b.kibo(10*time.Second, "node", "get", "dev", "--json")
		if err == nil && bytes.Contains(out, []byte(`"data_plane_address"`)) && bytes.Contains(out, []byte(`"acknowledged": true`)) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node dev not ready: %s", out)
		}
		time.Sleep(300 * time.Millisecond)
	}
	fmt.Printf("dev ready in %s\n", time.Since(t0).Round(time.Millisecond))
	out, err := b.kibo(5*time.Minute, "workspace", "create", "--template", "kibotos-base", "-q")
	if err != nil {
		return fmt.Errorf("workspace create: %v: %s", err, out)
	}
	b.ws = strings.TrimSpace(string(out))
	out, err = b.kibo(time.Minute, "workspace", "get", b.ws, "--json")
	if err != nil {
		return fmt.Errorf("workspace get: %v: %s", err, out)
	}
	var view struct {
		Result struct {
			InstanceID string `json:"instance_id"`
		} `json:"result"`
	}
	if err := json.Unmarshal(out, &view); err != nil {
		return err
	}
	b.instance = view.Result.InstanceID
	filepath.WalkDir(b.dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == "data.sock" && strings.Contains(p, b.instance) {
			b.dataSock = p
		}
		return nil
	})
	if b.dataSock == "" {
		return fmt.Errorf("no data.sock of %s under %s", b.instance, b.dir)
	}
	fmt.Printf("workspace %s (instance %s) available after %s; data socket %s\n", b.ws, b.instance, time.Since(t0).Round(time.Millisecond), b.dataSock)
	return nil
}

func (b *bench) down() {
	if b.dev == nil {
		return
	}
	if b.ws != "" {
		b.kibo(2*time.Minute, "workspace", "delete", b.ws, "--force")
	}
	select {
	case <-b.devDone:
	default:
		b.dev.Process.Signal(syscall.SIGINT)
		select {
		case <-b.devDone:
		case <-time.After(30 * time.Second):
			b.dev.Process.Kill()
			<-b.devDone
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(b.bin, "kibotos"), "dev", "down", "--data-dir", b.dir, "--purge")
	cmd.Env = hostprobe.CleanEnv()
	out, err := cmd.CombinedOutput()
	fmt.Printf("kibotos dev down --purge: %s %v\n", strings.TrimSpace(string(out)), errOrNil(err))
	b.dev = nil
	b.releasePorts()
}
