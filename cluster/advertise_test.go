package cluster

import (
	"testing"

	"github.com/kibotos/kibotos/api"
)

func TestAdvertiseHostProblem(t *testing.T) {
	nodes := []api.Node{
		{NodeID: "ctrl-1", Address: "10.0.0.1:7000", Status: api.NodeReady},
		{NodeID: "worker-1", Address: "worker-1.example.com:7000", Status: api.NodeDraining},
		{NodeID: "old", Address: "10.0.0.9:7000", Status: api.NodeRetired},
		{NodeID: "gone", Address: "10.0.0.8:7000", Status: api.NodeRevoked},
		{NodeID: "v6", Address: "[fd00::1]:7000", Status: api.NodeReady},
	}
	tests := []struct {
		name, node, host, leader string
		code                     api.Code
	}{
		{name: "a host of its own", node: "new", host: "10.0.0.2", leader: "10.0.0.1"},
		{name: "another member's IP", node: "new", host: "10.0.0.1", leader: "10.0.0.1", code: api.CodeAlreadyExists},
		{name: "another member's IP, IPv4-mapped", node: "new", host: "::ffff:10.0.0.1", leader: "10.0.0.1", code: api.CodeAlreadyExists},
		{name: "another member's IPv6, spelt long", node: "new", host: "fd00:0:0:0:0:0:0:1", leader: "10.0.0.1", code: api.CodeAlreadyExists},
		{name: "another member's name, other case, final dot", node: "new", host: "WORKER-1.example.com.", leader: "10.0.0.1", code: api.CodeAlreadyExists},
		{name: "its own earlier admission", node: "worker-1", host: "worker-1.example.com", leader: "10.0.0.1"},
		{name: "a retired node's", node: "new", host: "10.0.0.9", leader: "10.0.0.1"},
		{name: "a revoked node's", node: "new", host: "10.0.0.8", leader: "10.0.0.1"},
		{name: "localhost in a cluster across hosts", node: "new", host: "localhost", leader: "10.0.0.1", code: api.CodeInvalidArgument},
		{name: "127.0.0.2 in a cluster across hosts", node: "new", host: "127.0.0.2", leader: "ctrl-1.example.com", code: api.CodeInvalidArgument},
		{name: "::1 in a cluster across hosts", node: "new", host: "::1", leader: "10.0.0.1", code: api.CodeInvalidArgument},
		{name: "a.localhost in a cluster across hosts", node: "new", host: "a.LOCALHOST", leader: "10.0.0.1", code: api.CodeInvalidArgument},
		{name: "loopback in a cluster on one machine", node: "new", host: "127.0.0.1", leader: "127.0.0.1"},
		{name: "localhost in a cluster on one machine", node: "new", host: "localhost", leader: "127.0.0.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := advertiseHostProblem(tt.node, tt.host, tt.leader, nodes)
			if tt.code == "" && err != nil || tt.code != "" && api.CodeOf(err) != tt.code {
				t.Fatalf("advertiseHostProblem(%s, %s) = %v, want code %q", tt.node, tt.host, err, tt.code)
			}
		})
	}
}
