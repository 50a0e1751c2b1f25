package hostprobe

import (
	"testing"
)

func TestReservePorts(t *testing.T) {
	first, release, err := ReservePorts(4)
	if err != nil {
		t.Fatal(err)
	}
	if first < reservedLow || first+3 >= ephemeralLow() {
		t.Errorf("ports %d..%d: want them at or above %d and below the ephemeral range (%d)", first, first+3, reservedLow, ephemeralLow())
	}
	// Free for the caller, TCP and UDP, while another caller cannot
	// take any of them.
	for q := first; q < first+4; q++ {
		if !free(q) {
			t.Errorf("reserved port %d is not free for TCP and UDP", q)
		}
		if held, ok := hold(q, 1); ok {
			closeAll(held)
			t.Errorf("port %d was reserved twice", q)
		}
	}
	release()
	held, ok := hold(first, 4)
	if !ok {
		t.Fatalf("ports %d..%d still reserved after release", first, first+3)
	}
	closeAll(held)
	if _, _, err := ReservePorts(0); err == nil {
		t.Error("ReservePorts(0) gave ports")
	}
}
