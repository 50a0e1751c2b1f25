package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/fsm"
	"github.com/kibotos/kibotos/internal/ctxsleep"
	"github.com/kibotos/kibotos/trust"
)

// InitOptions create a new cluster.
type InitOptions struct {
	DataDir   datadir.Dir
	NodeID    string
	Advertise string
	Roles     []string
}

// prepareDir refuses a data directory that already holds a member and
// returns a temp sibling to build the new one in: init and join either
// leave a complete member behind or nothing.
func prepareDir(d datadir.Dir) (string, error) {
	if err := checkDirFree(d); err != nil {
		return "", err
	}
	parent := filepath.Dir(filepath.Clean(string(d)))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", err
	}
	return os.MkdirTemp(parent, "."+filepath.Base(string(d))+".new-*")
}

func checkDirFree(d datadir.Dir) error {
	if d.Exists() {
		return api.Errorf(api.CodeAlreadyExists, "data directory %s already holds a kibotos member; use another --data-dir or remove it", d)
	}
	if entries, err := os.ReadDir(string(d)); err == nil && len(entries) > 0 {
		return api.Errorf(api.CodeAlreadyExists, "data directory %s is not empty; use an empty or new directory", d)
	}
	return nil
}

func finishDir(tmp string, d datadir.Dir) error {
	os.Remove(string(d)) // an empty directory may be in the way
	if err := os.Rename(tmp, string(d)); err != nil {
		return fmt.Errorf("move new data directory into place at %s: %w", d, err)
	}
	return nil
}

func writeFiles(files map[string][]byte) error {
	for path, data := range files {
		if err := datadir.WriteFileAtomic(path, data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// Init creates a new cluster whose first voter is this host.
func Init(ctx context.Context, o InitOptions) (*datadir.Identity, error) {
	if err := fsm.ValidNodeID(o.NodeID); err != nil {
		return nil, err
	}
	if err := fsm.ValidRoles(o.Roles); err != nil {
		return nil, err
	}
	if !contains(o.Roles, api.RoleCtrl) {
		return nil, api.Errorf(api.CodeInvalidArgument, "the first member of a cluster must have the ctrl role")
	}
	if err := api.ValidAdvertise(o.Advertise); err != nil {
		return nil, err
	}
	tmp, err := prepareDir(o.DataDir)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	t := datadir.Dir(tmp)

	cid := make([]byte, 8)
	rand.Read(cid)
	clusterID := "kc-" + hex.EncodeToString(cid)
	ca, err := trust.NewCA(clusterID)
	if err != nil {
		return nil, err
	}
	host, _, _ := net.SplitHostPort(o.Advertise)
	// The bootstrap entry admits this node at this time; its certificates
	// name the same admission.
	admitted := time.Now().UTC()
	member := trust.Identity{ClusterID: clusterID, Kind: trust.KindMember, NodeID: o.NodeID, Roles: o.Roles, Admitted: admitted}
	memberCert, memberKey, err := ca.IssueKeyPair(member, []string{host, "localhost", "127.0.0.1"}, trust.MemberLifetime)
	if err != nil {
		return nil, err
	}
	caKey, err := trust.EncodeKey(ca.Key)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{
		t.CACert(): ca.CertPEM, t.CAKey(): caKey,
		t.MemberCert(): append(memberCert, ca.CertPEM...), t.MemberKey(): memberKey,
	}
	if holdsOperatorCert(o.Roles) {
		admin := trust.Identity{ClusterID: clusterID, Kind: trust.KindAdmin, NodeID: o.NodeID, Admitted: admitted}
		adminCert, adminKey, err := ca.IssueKeyPair(admin, nil, trust.AdminLifetime)
		if err != nil {
			return nil, err
		}
		files[t.AdminCert()], files[t.AdminKey()] = adminCert, adminKey
	}
	gossipKey := make([]byte, 32)
	rand.Read(gossipKey)
	id := &datadir.Identity{ClusterID: clusterID, NodeID: o.NodeID, Roles: o.Roles, Advertise: o.Advertise,
		GossipKey: gossipKey, CAFingerprint: trust.Fingerprint(ca.Cert)}
	if err := writeFiles(files); err != nil {
		return nil, err
	}
	if err := bootstrapRaft(ctx, t, id, admitted); err != nil {
		return nil, err
	}
	if err := t.SaveIdentity(id); err != nil {
		return nil, err
	}
	if err := finishDir(tmp, o.DataDir); err != nil {
		return nil, err
	}
	return id, nil
}

// bootstrapRaft writes the first Raft configuration and the bootstrap entry
// by running a one-voter Raft briefly on an in-memory transport.
func bootstrapRaft(ctx context.Context, d datadir.Dir, id *datadir.Identity, admitted time.Time) error {
	if err := os.MkdirAll(d.RaftDir(), 0o700); err != nil {
		return err
	}
	store, err := openLogStore(ctx, d.RaftDir(), slog.New(slog.DiscardHandler), hclog.NewNullLogger())
	if err != nil {
		return err
	}
	defer store.Close()
	snaps, err := raft.NewFileSnapshotStoreWithLogger(d.RaftDir(), 2, hclog.NewNullLogger())
	if err != nil {
		return err
	}
	_, trans := raft.NewInmemTransport(raft.ServerAddress(id.Advertise))
	conf := raft.DefaultConfig()
	conf.LocalID = raft.ServerID(id.NodeID)
	conf.HeartbeatTimeout, conf.ElectionTimeout, conf.LeaderLeaseTimeout = 50*time.Millisecond, 50*time.Millisecond, 50*time.Millisecond
	conf.Logger = hclog.NewNullLogger() // a one-voter election with no peers is all that happens here
	bootConf := *conf                   // BootstrapCluster may mark the config it is given as not-to-start
	if err := raft.BootstrapCluster(&bootConf, store, store, snaps, trans, raft.Configuration{Servers: []raft.Server{
		{Suffrage: raft.Voter, ID: conf.LocalID, Address: raft.ServerAddress(id.Advertise)},
	}}); err != nil {
		return fmt.Errorf("bootstrap raft: %w", err)
	}
	f, err := fsm.Open(d.StateFile())
	if err != nil {
		return err
	}
	defer f.Close()
	r, err := raft.NewRaft(conf, &raftFSM{f: f}, store, store, snaps, trans)
	if err != nil {
		return err
	}
	// Not "defer r.Shutdown().Error()": that would shut down right away.
	defer func() { r.Shutdown().Error() }()
	deadline := time.Now().Add(10 * time.Second)
	for r.State() != raft.Leader {
		if time.Now().After(deadline) {
			return errors.New("bootstrap raft: no leader after 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	args, _ := json.Marshal(fsm.BootstrapArgs{ClusterID: id.ClusterID, NodeID: id.NodeID, Roles: id.Roles, Address: id.Advertise})
	data, _ := json.Marshal(fsm.Entry{Op: fsm.OpBootstrap, Args: args, IssuedAt: admitted, Actor: "init"})
	fut := r.Apply(data, 10*time.Second)
	if err := fut.Error(); err != nil {
		return fmt.Errorf("bootstrap raft: %w", err)
	}
	if res, ok := fut.Response().(fsm.Result); ok && res.Error != nil {
		return res.Error
	}
	return nil
}

// JoinOptions enroll this host into an existing cluster.
type JoinOptions struct {
	DataDir   datadir.Dir
	Advertise string
	Grant     string
	Member    string // API address of any member
}

// Join enrolls this host with a grant and leaves a data directory ready for
// `kibotos serve`. A refused grant leaves nothing behind.
func Join(ctx context.Context, o JoinOptions) (*datadir.Identity, error) {
	if err := api.ValidAdvertise(o.Advertise); err != nil {
		return nil, err
	}
	tok, err := parseGrantToken(o.Grant)
	if err != nil {
		return nil, err
	}
	if err := checkDirFree(o.DataDir); err != nil {
		return nil, err
	}
	memberKey, err := trust.NewKey()
	if err != nil {
		return nil, err
	}
	adminKey, err := trust.NewKey()
	if err != nil {
		return nil, err
	}
	// The join's own secret: ctrl answers a retry of this request, and
	// no other, with the admission it made.
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, err
	}
	body, _ := json.Marshal(api.JoinRequest{Token: o.Grant, Advertise: o.Advertise,
		MemberKey: trust.PublicKeyPEM(&memberKey.PublicKey), AdminKey: trust.PublicKeyPEM(&adminKey.PublicKey),
		JoinSecret: hex.EncodeToString(secret)})
	jr, err := retryUnavailable(ctx, func() (api.JoinResponse, error) {
		jr, err := postJoin(ctx, o.Member, tok.CA, trust.Want{Kind: trust.KindMember}, body)
		var ctrl misdirected
		if errors.As(err, &ctrl) {
			// A node-only member sends the joining host to ctrl.
			for _, addr := range ctrl {
				jr, err = postJoin(ctx, addr, tok.CA, trust.Want{Kind: trust.KindMember, Role: trust.RoleCtrl}, body)
				if api.CodeOf(err) != api.CodeUnavailable {
					break
				}
			}
		}
		return jr, err
	})
	if err != nil {
		return nil, err
	}
	tmp, err := prepareDir(o.DataDir)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	t := datadir.Dir(tmp)
	mk, _ := trust.EncodeKey(memberKey)
	ak, _ := trust.EncodeKey(adminKey)
	files := map[string][]byte{
		t.CACert(): []byte(jr.CACert), t.MemberCert(): []byte(jr.MemberCert), t.MemberKey(): mk,
	}
	if jr.AdminCert != "" && holdsOperatorCert(jr.Roles) {
		// An older ctrl build gives every host one; a node-only host
		// keeps none (no other member accepts it anyway).
		files[t.AdminCert()], files[t.AdminKey()] = []byte(jr.AdminCert), ak
	}
	if jr.CAKey != "" {
		files[t.CAKey()] = []byte(jr.CAKey)
	}
	if err := writeFiles(files); err != nil {
		return nil, err
	}
	peers := jr.Peers
	if !contains(peers, o.Member) {
		peers = append(peers, o.Member)
	}
	id := &datadir.Identity{ClusterID: jr.ClusterID, NodeID: jr.NodeID, Roles: jr.Roles, Advertise: o.Advertise,
		GossipKey: jr.GossipKey, CAFingerprint: tok.CA, Peers: peers}
	if err := t.SaveIdentity(id); err != nil {
		return nil, err
	}
	if err := finishDir(tmp, o.DataDir); err != nil {
		return nil, err
	}
	return id, nil
}

// How long a join is sent again while ctrl answers that it cannot decide
// now (no leader, or the leader changed while the admission was in
// flight), and the longest wait between two tries.
const (
	joinRetryFor  = 30 * time.Second
	joinRetryWait = 2 * time.Second
)

// retryUnavailable sends a join again while ctrl answers "unavailable",
// for joinRetryFor. The same request is sent each time, and ctrl replays
// an admission it recorded for it: a retry never admits a host twice nor
// spends the grant. A member not reached at all is not retried: a wrong
// address fails at once.
func retryUnavailable(ctx context.Context, send func() (api.JoinResponse, error)) (api.JoinResponse, error) {
	give := time.Now().Add(joinRetryFor)
	wait := 250 * time.Millisecond
	for {
		jr, err := send()
		var unreached unreachable
		if api.CodeOf(err) != api.CodeUnavailable || errors.As(err, &unreached) || time.Now().Add(wait).After(give) {
			return jr, err
		}
		if ctxsleep.Sleep(ctx, wait) != nil {
			return jr, err
		}
		wait = min(2*wait, joinRetryWait)
	}
}

// unreachable is a join that reached no member.
type unreachable struct{ err error }

func (u unreachable) Error() string { return u.err.Error() }
func (u unreachable) Unwrap() error { return u.err }

// misdirected is the ctrl members a node-only member named instead of
// answering a join.
type misdirected []string

func (m misdirected) Error() string { return "misdirected to ctrl members " + strings.Join(m, ", ") }

// postJoin sends the join request to addr, trusting the member there when
// its chain ends in the CA the grant names.
func postJoin(ctx context.Context, addr, caFingerprint string, want trust.Want, body []byte) (api.JoinResponse, error) {
	client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		InsecureSkipVerify: true, // trust comes from the CA fingerprint in the grant
		VerifyConnection:   pinCA(caFingerprint, want, addr),
		NextProtos:         []string{datadir.ProtoHTTP},
		MinVersion:         tls.VersionTLS13,
	}}}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+addr+"/v1/join", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return api.JoinResponse{}, unreachable{api.Errorf(api.CodeUnavailable, "join through member %s: %v; check the address and that the member is serving", addr, err)}
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusMisdirectedRequest && resp.Header.Get(api.HdrCtrl) != "" {
		return api.JoinResponse{}, misdirected(strings.Split(resp.Header.Get(api.HdrCtrl), ","))
	}
	if resp.StatusCode != http.StatusOK {
		var eb api.ErrorBody
		if json.NewDecoder(io.LimitReader(resp.Body, maxBody)).Decode(&eb) == nil && eb.Error != nil {
			return api.JoinResponse{}, eb.Error
		}
		return api.JoinResponse{}, api.Errorf(api.CodeInternal, "join through member %s: %s", addr, resp.Status)
	}
	var out struct {
		Result api.JoinResponse `json:"result"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxBody)).Decode(&out); err != nil {
		return api.JoinResponse{}, fmt.Errorf("join through member %s: bad answer: %w", addr, err)
	}
	return out.Result, nil
}

// pinCA accepts a server whose chain ends in the CA with the given
// fingerprint, whose leaf that CA signed for the dialled host and whose
// identity is what was wanted.
func pinCA(fingerprint string, want trust.Want, addr string) func(tls.ConnectionState) error {
	host, _, _ := net.SplitHostPort(addr)
	return func(cs tls.ConnectionState) error {
		for _, c := range cs.PeerCertificates {
			if trust.Fingerprint(c) == fingerprint {
				pool := x509.NewCertPool()
				pool.AddCert(c)
				return trust.ServerCheck(pool, want, host)(cs)
			}
		}
		return errors.New("the member does not present the cluster CA named in the grant: wrong address or wrong cluster")
	}
}
