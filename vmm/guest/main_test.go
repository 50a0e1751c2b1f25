package guest

import (
	"os"
	"testing"

	"github.com/kibotos/kibotos/internal/testenv"
)

// The tests check what a hangup ends: their shells must not inherit an
// ignored SIGHUP from a test run started under nohup.
func TestMain(m *testing.M) {
	testenv.DefaultSIGHUP()
	os.Exit(m.Run())
}
