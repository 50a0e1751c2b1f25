// Command kibotos is the one binary of a Kibotos cluster: member process,
// operator CLI and internal roles. Invoked as "kibo" it behaves the same.
package main

import (
	"context"
	"os"
	"path/filepath"

	"github.com/kibotos/kibotos/cli"
	"github.com/kibotos/kibotos/vmm/units/privsd"
)

func main() {
	privsd.RunIfInit() // as the private systemd's PID 1, this never returns
	name := filepath.Base(os.Args[0])
	if name != "kibo" {
		name = "kibotos"
	}
	os.Exit(cli.Main(context.Background(), name, os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
