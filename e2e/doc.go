// Package e2e holds end-to-end tests that run real kibotos processes, one per
// network namespace, and break the network and the processes between them.
// The tests need root and iproute2 (ip); without them they skip.
package e2e
