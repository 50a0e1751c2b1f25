package template

import (
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// treeLibDir is where a template's shared objects go: a directory the
// dynamic loader searches by itself, so the template needs no
// ld.so.cache (Debian's loader lists /lib/x86_64-linux-gnu, then
// /usr/lib/x86_64-linux-gnu as its system search path).
const treeLibDir = "usr/lib/x86_64-linux-gnu"

// hostLibDirs are where the host's loader finds shared objects, in its
// order (`ld.so --help`): the host's Debian packages installed them there.
var hostLibDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib", "/usr/lib"}

// copyProgram copies the host's program to dest in tree with what it needs
// to run there: the shared objects it links (DT_NEEDED, recursively,
// found as the host's loader finds them) into treeLibDir and its ELF
// interpreter at the path the program names. Everything comes from the
// host, so the program and its libc are of one glibc build.
func copyProgram(tree, program, dest string) error {
	interp, needed, err := elfDeps(program)
	if err != nil {
		return err
	}
	copied := map[string]bool{}
	for len(needed) > 0 {
		name := needed[0]
		needed = needed[1:]
		if copied[name] {
			continue
		}
		lib, err := findHostLib(name)
		if err != nil {
			return fmt.Errorf("%s needs %s: %w", program, name, err)
		}
		if err := copyResolved(lib, filepath.Join(tree, treeLibDir, name)); err != nil {
			return err
		}
		copied[name] = true
		_, more, err := elfDeps(lib)
		if err != nil {
			return err
		}
		needed = append(needed, more...)
	}
	if interp != "" {
		// The loader is one of libc's objects: keep it with the others
		// and point the interpreter path at it.
		base := filepath.Base(interp)
		if !copied[base] {
			if err := copyResolved(interp, filepath.Join(tree, treeLibDir, base)); err != nil {
				return err
			}
		}
		link := filepath.Join(tree, interp)
		if link != filepath.Join(tree, treeLibDir, base) {
			if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
				return err
			}
			target, err := filepath.Rel(filepath.Dir(interp), "/"+treeLibDir+"/"+base)
			if err != nil {
				return err
			}
			os.Remove(link)
			if err := os.Symlink(target, link); err != nil {
				return err
			}
		}
	}
	return copyResolved(program, filepath.Join(tree, dest))
}

// elfDeps reads an x86-64 ELF file's interpreter ("" when static) and the
// shared objects it names.
func elfDeps(path string) (interp string, needed []string, err error) {
	f, err := elf.Open(path)
	if err != nil {
		return "", nil, fmt.Errorf("%s: not a readable ELF file: %w", path, err)
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 || f.Class != elf.ELFCLASS64 {
		return "", nil, fmt.Errorf("%s is built for %v %v; the guest is x86-64", path, f.Class, f.Machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				return "", nil, fmt.Errorf("%s: read the interpreter: %w", path, err)
			}
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	needed, err = f.ImportedLibraries()
	if err != nil {
		return "", nil, fmt.Errorf("%s: read DT_NEEDED: %w", path, err)
	}
	return interp, needed, nil
}

func findHostLib(name string) (string, error) {
	if strings.Contains(name, "/") {
		return "", fmt.Errorf("a path in DT_NEEDED is not supported")
	}
	for _, dir := range hostLibDirs {
		p := filepath.Join(dir, name)
		f, err := elf.Open(p)
		if err != nil {
			continue
		}
		ok := f.Machine == elf.EM_X86_64 && f.Class == elf.ELFCLASS64
		f.Close()
		if ok {
			return p, nil
		}
	}
	return "", fmt.Errorf("not found in %s", strings.Join(hostLibDirs, ", "))
}

// copyResolved copies the file src names (following symlinks: Debian's
// sonames are links to versioned files) to dst with its permissions.
func copyResolved(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	// dst may be a symlink (an applet's link to busybox): replace it,
	// never write through it.
	if err := os.Remove(dst); err != nil && !os.IsNotExist(err) {
		return err
	}
	if err := os.WriteFile(dst, b, fi.Mode().Perm()); err != nil {
		return err
	}
	return os.Chmod(dst, fi.Mode().Perm())
}
