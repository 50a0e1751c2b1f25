package template

import (
	"bytes"
	"strings"
	"testing"
)

func TestDisableApplet(t *testing.T) {
	applets := []string{"[", "cat", "wc", "wget", "which"}
	bin := []byte("\x7fELF...usage: wget URL\x00\x00[\x00cat\x00wc\x00wget\x00which\x00\x00more")
	out, renamed, err := disableApplet(bin, applets, "wget")
	if err != nil {
		t.Fatal(err)
	}
	if renamed != "wge~" || len(out) != len(bin) {
		t.Fatalf("renamed %q, %d bytes of %d", renamed, len(out), len(bin))
	}
	if want := []byte("\x7fELF...usage: wget URL\x00\x00[\x00cat\x00wc\x00wge~\x00which\x00\x00more"); !bytes.Equal(out, want) {
		t.Fatalf("patched %q\nwant    %q", out, want)
	}
	if !strings.Contains(string(bin), "\x00wget\x00") {
		t.Fatal("the input was changed")
	}
	for what, b := range map[string][]byte{
		"no table":  []byte("\x00[\x00cat\x00wget\x00which\x00"),
		"two":       []byte("\x00[\x00cat\x00wc\x00wget\x00which\x00 \x00[\x00cat\x00wc\x00wget\x00which\x00"),
		"truncated": []byte("\x00[\x00cat\x00wc\x00wget\x00whic"),
	} {
		if _, _, err := disableApplet(b, applets, "wget"); err == nil {
			t.Errorf("%s: patched", what)
		}
	}
	if _, _, err := disableApplet(bin, []string{"[", "cat", "wc", "wget", "wge~x"}, "wget"); err == nil {
		t.Error("a rename that breaks the order was made")
	}
	if _, _, err := disableApplet(bin, applets, "nc"); err == nil {
		t.Error("an applet busybox does not have was disabled")
	}
}
