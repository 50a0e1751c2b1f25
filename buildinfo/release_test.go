package buildinfo

import "testing"

func TestReleaseLines(t *testing.T) {
	for _, c := range []struct {
		a, b string
		same bool
	}{
		{"0.2.0", "0.2.7", true},
		{"v1.4.2", "1.4.0", true},
		{"0.2.0", "0.3.0", false},        // across MINOR
		{"1.2.0", "2.2.0", false},        // across MAJOR
		{"0.3.0-beta.1", "0.3.0", false}, // a pre-release is on no line
		{"0.3.0-alpha.2", "0.3.0-alpha.2", false},
		{"unreleased", "unreleased", false}, // nor is an unreleased build
		{"", "0.2.0", false},
		{"0.2", "0.2.0", false},
	} {
		if got := SameLine(c.a, c.b); got != c.same {
			t.Errorf("SameLine(%q, %q) = %v, want %v", c.a, c.b, got, c.same)
		}
	}
	for _, bad := range []string{"1", "1.2", "01.2.3", "1.2.3-rc.1", "1.2.3-beta", "1.2.3+meta", "x.y.z"} {
		if _, err := ParseRelease(bad); err == nil {
			t.Errorf("ParseRelease(%q) accepted", bad)
		}
	}
	v, err := ParseRelease("v0.3.1-beta.2")
	if err != nil || v.String() != "0.3.1-beta.2" || v.Line() != "" {
		t.Errorf("ParseRelease: %+v %v", v, err)
	}
}

func TestReleaseCompare(t *testing.T) {
	order := []string{"0.1.0", "0.2.0-alpha.1", "0.2.0-alpha.2", "0.2.0-beta.1", "0.2.0", "0.2.1", "0.10.0", "1.0.0"}
	for i := range order {
		for j := range order {
			a, _ := ParseRelease(order[i])
			b, _ := ParseRelease(order[j])
			if got, want := a.Compare(b), cmpInt(i, j); got != want {
				t.Errorf("%s vs %s: %d, want %d", order[i], order[j], got, want)
			}
		}
	}
}
