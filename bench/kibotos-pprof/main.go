// Command kibotos-pprof is the kibotos binary with net/http/pprof served on
// the loopback address in KIBOTOS_PPROF (for example 127.0.0.1:6060), for
// profiling a member under benchmark load without changing the product:
//
//	KIBOTOS_PPROF=127.0.0.1:6060 kibotos-pprof serve --data-dir DIR
//	go tool pprof -seconds 10 http://127.0.0.1:6060/debug/pprof/profile
//
// With KIBOTOS_CPUPROFILE=FILE a CLI command writes its own CPU profile:
//
//	KIBOTOS_CPUPROFILE=list.pprof kibotos-pprof --data-dir DIR node list >/dev/null
package main

import (
	"context"
	"fmt"
	"net/http"
	_ "net/http/pprof"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"

	"github.com/kibotos/kibotos/cli"
	"github.com/kibotos/kibotos/vmm/units/privsd"
)

func main() {
	privsd.RunIfInit() // as the private systemd's PID 1, this never returns
	if addr := os.Getenv("KIBOTOS_PPROF"); addr != "" {
		runtime.SetBlockProfileRate(int(1e6)) // one sample per ms blocked
		runtime.SetMutexProfileFraction(100)
		go func() {
			if err := http.ListenAndServe(addr, nil); err != nil {
				fmt.Fprintf(os.Stderr, "kibotos-pprof: %v\n", err)
			}
		}()
	}
	if file := os.Getenv("KIBOTOS_CPUPROFILE"); file != "" {
		f, err := os.Create(file)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "kibotos-pprof: %v\n", err)
			os.Exit(1)
		}
		code := run()
		pprof.StopCPUProfile()
		f.Close()
		os.Exit(code)
	}
	os.Exit(run())
}

func run() int {
	name := filepath.Base(os.Args[0])
	if name != "kibo" {
		name = "kibotos"
	}
	return cli.Main(context.Background(), name, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
}
