package runtime

// UnconfinedVMM makes the Runtime launch VMMs as builds before VMM
// confinement did (root, no seccomp, file console): the Instances an
// upgraded node has to take over.
func UnconfinedVMM(c Config) Config {
	c.unconfinedVMM = true
	return c
}

// VMMLimits is vmmLimits for tests.
var VMMLimits = vmmLimits
