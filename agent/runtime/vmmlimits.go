package runtime

// Overheads of a confined QEMU VMM beside its guest, for the unit's
// MemoryMax and TasksMax. The limits are there so a VMM gone wrong (or a
// guest driving it into growth) is killed in its own unit (OOMPolicy=kill)
// instead of the host's memory or PID space running out.
const (
	// VMMMemoryOverheadMiB: a microvm QEMU under TCG with virtio-serial,
	// blk and net measured 217-270 MiB RSS for a 256 MiB guest at 1 vCPU
	// (recipes), and 293 MiB (VmRSS 300436 kB) at 2 vCPUs in
	// TestConfinedVMM; ~43 MiB of it is the TCG translation cache, the rest
	// guest pages touched plus QEMU's own code, heap and I/O buffers. 384
	// MiB above the guest size leaves room for the translation cache of
	// more vCPUs, block and chardev buffers and a migration stream, and
	// still never lets a VMM take much more than its guest was given.
	VMMMemoryOverheadMiB = 384
	// VMMTasksBase, VMMTasksPerVCPU: a running confined QEMU with 2 vCPUs
	// had 6 threads (main loop, RCU, one per vCPU, and I/O helpers) in
	// TestConfinedVMM. Block I/O adds thread-pool workers on demand, up to
	// QEMU's default pool size of 64: the base covers that pool, 2 per vCPU
	// a vCPU thread and one more helper each. The log wrapper shell is the
	// same task (it exec's QEMU).
	VMMTasksBase    = 64
	VMMTasksPerVCPU = 2
)

// vmmLimits are the MemoryMax (bytes) and TasksMax of a VMM unit for a guest.
func vmmLimits(memoryMiB, vcpus int) (memoryMax, tasksMax uint64) {
	if memoryMiB <= 0 {
		memoryMiB = 256 // QEMU's default in vmm/qemu
	}
	if vcpus <= 0 {
		vcpus = 1
	}
	return uint64(memoryMiB+VMMMemoryOverheadMiB) << 20, uint64(VMMTasksBase + VMMTasksPerVCPU*vcpus)
}
