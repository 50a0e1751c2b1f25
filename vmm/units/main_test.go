package units_test

import (
	"os"
	"testing"

	"github.com/kibotos/kibotos/vmm/units/privsd"
)

func TestMain(m *testing.M) {
	privsd.RunIfInit() // the private systemd the tests start is this binary
	os.Exit(m.Run())
}
