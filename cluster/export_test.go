package cluster

// OpenLogStore opens a stopped member's Raft log for tests.
var OpenLogStore = openLogStore

// ForgetCaughtUp makes a leading member look just elected: its lead
// loop's barrier not yet through.
func (s *Server) ForgetCaughtUp() { s.consistentReady.Store(false) }
