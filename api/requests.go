package api

import "time"

// NodeWriteRequest is the body of drain, cancel-drain, isolate and retire.
type NodeWriteRequest struct {
	WriteMeta
	// ConfirmHostCannotWrite is the operator's assertion isolate requires.
	ConfirmHostCannotWrite bool `json:"confirm_host_cannot_write,omitempty"`
}

// OvercommitSetRequest changes a node's multipliers: each item is a decimal
// ("2.5"), "default" (node set only) or absent (unchanged).
type OvercommitSetRequest struct {
	WriteMeta
	CPU    *string `json:"cpu,omitempty"`
	Memory *string `json:"memory,omitempty"`
}

// OvercommitView is `overcommit get`: the default and every node's values.
type OvercommitView struct {
	Default OvercommitDefault `json:"default"`
	Nodes   []NodeOvercommit  `json:"nodes"`
}

// NodeOvercommit is one node's effective multipliers.
type NodeOvercommit struct {
	NodeID              string     `json:"node_id"`
	RegistrationVersion uint64     `json:"registration_version"`
	Overcommit          Overcommit `json:"overcommit"`
}

// GrantRequest asks for an enrollment grant.
type GrantRequest struct {
	WriteMeta
	NodeID string   `json:"node_id"`
	Roles  []string `json:"roles"`
	TTL    string   `json:"ttl"`
}

// GrantResponse carries the grant token; it is shown once and never stored.
type GrantResponse struct {
	Grant Grant  `json:"grant"`
	Token string `json:"token"`
}

// JoinRequest enrolls a new host with a grant token.
type JoinRequest struct {
	Token     string `json:"token"`
	Advertise string `json:"advertise"`
	MemberKey string `json:"member_public_key"` // PEM
	AdminKey  string `json:"admin_public_key"`  // PEM
	// JoinSecret is drawn by the joining host for this join (64 hex
	// digits) and known to it alone: the same join sent again with it,
	// after its answer was lost, is answered with the admission it made.
	// Without it (older builds) a used grant is refused.
	JoinSecret string `json:"join_secret,omitempty"`
}

// JoinResponse hands the new member everything it needs to serve.
type JoinResponse struct {
	ClusterID  string   `json:"cluster_id"`
	NodeID     string   `json:"node_id"`
	Roles      []string `json:"roles"`
	CACert     string   `json:"ca_cert"`
	CAKey      string   `json:"ca_key,omitempty"` // ctrl members sign certificates when they lead
	MemberCert string   `json:"member_cert"`
	// AdminCert is the host's operator certificate, only for ctrl
	// members and members admitted with the operator role.
	AdminCert string   `json:"admin_cert,omitempty"`
	GossipKey []byte   `json:"gossip_key"`
	Peers     []string `json:"peers"`
}

// AddVoterRequest asks the leader to add a ctrl member to the Raft group.
type AddVoterRequest struct {
	NodeID  string `json:"node_id"`
	Address string `json:"address"`
}

// Status describes the member that answered.
type Status struct {
	ClusterID string    `json:"cluster_id"`
	NodeID    string    `json:"node_id"`
	Roles     []string  `json:"roles"`
	Advertise string    `json:"advertise"`
	RaftState string    `json:"raft_state"`
	Leader    string    `json:"leader"`
	Release   string    `json:"release"`
	Revision  string    `json:"revision"`
	Time      time.Time `json:"time"`
}

// RenewRequest asks a ctrl member for fresh certificates of the calling
// member: the member certificate for the key of the certificate the call
// is made with, and an operator certificate for AdminKey (given by ctrl
// members and members admitted with the operator role only: others hold
// no operator credential and are refused one).
type RenewRequest struct {
	AdminKey string `json:"admin_public_key,omitempty"` // PEM
}

// RenewResponse carries the renewed certificates (PEM, the member
// certificate followed by the CA).
type RenewResponse struct {
	MemberCert string `json:"member_cert"`
	AdminCert  string `json:"admin_cert,omitempty"`
}

// DataPlaneCertRequest asks a ctrl member for the server certificate of the
// calling node's data-plane process. Hosts are the addresses it listens on.
type DataPlaneCertRequest struct {
	PublicKey string   `json:"public_key"` // PEM
	Hosts     []string `json:"hosts"`
}

// DataPlaneCertResponse is the data-plane certificate (PEM, then the CA).
type DataPlaneCertResponse struct {
	Cert     string    `json:"cert"`
	NotAfter time.Time `json:"not_after"`
}

// AdmissionRequest asks ctrl whether the node behind a certificate is
// admitted (node-only members, which hold no state, ask it).
type AdmissionRequest struct {
	Kind     string    `json:"kind"`
	NodeID   string    `json:"node_id"`
	Roles    []string  `json:"roles,omitempty"`
	Admitted time.Time `json:"admitted"`
}
