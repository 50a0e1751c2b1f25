package cluster

// OpenLogStore opens a stopped member's Raft log for tests.
var OpenLogStore = openLogStore
