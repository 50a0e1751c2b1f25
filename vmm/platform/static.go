package platform

import (
	"debug/elf"
	"fmt"
)

// checkStatic makes sure an executable can run in the initramfs, which has
// no dynamic loader and no libc. hint says how to get a static build.
func checkStatic(path, what, hint string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s %s: not a readable ELF executable: %w", what, path, err)
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 {
		return fmt.Errorf("%s %s is built for %v; the guest is x86-64", what, path, f.Machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			interp := make([]byte, p.Filesz)
			p.ReadAt(interp, 0)
			return fmt.Errorf("%s %s is dynamically linked (interpreter %s) but the guest has no dynamic loader: %s",
				what, path, string(trimNUL(interp)), hint)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		return fmt.Errorf("%s %s needs shared libraries %v but the guest has none: %s", what, path, libs, hint)
	}
	return nil
}

func trimNUL(b []byte) []byte {
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	return b
}
