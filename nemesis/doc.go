// Package nemesis runs a real cluster (clusterlab: members in network
// namespaces, real QEMU guests under a private systemd) under a workload
// and a seeded schedule of faults, records what every client saw, and
// checks the record and the hosts afterwards:
//
//   - every Workspace's versions, as consistent reads and expected-version
//     writes saw them, are linearizable (porcupine);
//   - no layer is ever open in two QEMU processes at once (sampled), so no
//     Workspace ever runs twice;
//   - every append acknowledged after its sync is read back once the
//     faults are healed;
//   - every Workspace settles in a stable state within a bound;
//   - nothing is left once everything is deleted, and no log holds a panic.
//
// The same seed gives the same workload choices and fault schedule; the
// interleaving is the machine's, so a report names the seed and the
// history of the Workspace an anomaly concerns.
package nemesis
