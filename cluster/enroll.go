package cluster

import (
	"bytes"
	"context"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
	"github.com/kibotos/kibotos/trust"
)

const tokenPrefix = "kbg1."

// grantToken is what an enrollment grant string carries: which node id it
// admits, the secret, and the CA fingerprint the joining host pins.
type grantToken struct {
	NodeID string `json:"n"`
	Secret []byte `json:"s"`
	CA     string `json:"c"`
}

func (g grantToken) encode() string {
	raw, _ := json.Marshal(g)
	return tokenPrefix + base64.RawURLEncoding.EncodeToString(raw)
}

func parseGrantToken(s string) (grantToken, error) {
	var g grantToken
	if !strings.HasPrefix(s, tokenPrefix) {
		return g, api.Errorf(api.CodeInvalidArgument, "the grant is not a kibotos enrollment grant (it starts with %q); copy the whole string printed by kibo enrollment grant", tokenPrefix)
	}
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(s, tokenPrefix))
	if err == nil {
		err = json.Unmarshal(raw, &g)
	}
	if err != nil || g.NodeID == "" || len(g.Secret) == 0 || g.CA == "" {
		return g, api.Errorf(api.CodeInvalidArgument, "the enrollment grant is damaged; copy the whole string printed by kibo enrollment grant")
	}
	return g, nil
}

func secretHash(secret []byte) string {
	sum := sha256.Sum256(secret)
	return hex.EncodeToString(sum[:])
}

// DefaultGrantTTL is how long a grant is valid unless --ttl says otherwise.
const DefaultGrantTTL = time.Hour

// joinPath is the one route served without a certificate: a joining host
// proves itself with the grant in the body.
const joinPath = "/v1/join"

// enrollmentRoutes grant, revoke and consume enrollment grants.
func (s *Server) enrollmentRoutes() []route {
	return []route{
		{"POST", joinPath, grantHolders, atLeader, decoded(s.handleJoin)},
		{"GET", "/v1/enrollment/grants", operators, atReader, s.handleGrantList},
		{"POST", "/v1/enrollment/grants", operators, atLeader, decoded(s.handleGrant)},
		{"POST", "/v1/enrollment/grants/{id}/revoke", operators, atLeader, decoded(s.handleRevoke)},
	}
}

func (s *Server) handleGrant(r *http.Request, req api.GrantRequest) response {
	ttl := DefaultGrantTTL
	if req.TTL != "" {
		d, err := time.ParseDuration(req.TTL)
		if err != nil || d <= 0 {
			return fail(api.Errorf(api.CodeInvalidArgument, "ttl %q is not a positive duration such as 30m or 24h", req.TTL))
		}
		ttl = d
	}
	if len(req.Roles) == 0 {
		req.Roles = []string{api.RoleNode}
	}
	if err := s.operatorGrantLevel(req.Roles); err != nil {
		return fail(err)
	}
	secret, err := s.grantSecret(req)
	if err != nil {
		return fail(err)
	}
	tok := grantToken{NodeID: req.NodeID, Secret: secret, CA: trust.Fingerprint(s.signingCA().Cert)}
	raw, _ := json.Marshal(fsm.GrantArgs{NodeID: req.NodeID, Roles: req.Roles, SecretHash: secretHash(tok.Secret), TTL: ttl})
	res, err := s.Apply(r.Context(), fsm.Entry{CommandID: req.CommandID, ExpectedVersion: req.ExpectedVersion, Actor: callerOf(r).name, Op: fsm.OpEnrollmentGrant, Args: raw})
	if err != nil {
		return fail(err)
	}
	if res.Error != nil {
		return fail(res.Error)
	}
	var g api.Grant
	json.Unmarshal(res.Value, &g)
	if contains(g.Roles, api.RoleOperator) {
		// Its host will hold an operator credential: worth a line of its
		// own beside the write's audit line.
		s.log.Warn("enrollment grant with the operator role", "grant_node_id", g.NodeID, "roles", g.Roles, "granted_by", callerOf(r).name)
	}
	out := api.GrantResponse{Grant: g}
	if !res.Replayed || req.CommandID != "" {
		out.Token = tok.encode()
	}
	return resultResponse{value: out, replayed: res.Replayed}
}

// grantSecret is a grant's secret: random, or with a command id derived
// from the CA key, the command id and the request, so that a replay of
// the same command (a retry after a lost answer) proposes the same inputs
// and gets the same grant back, still usable once; every ctrl voter holds
// the CA key, so whichever leads derives the same. Without the CA key
// the secret cannot be computed from the command id.
func (s *Server) grantSecret(req api.GrantRequest) ([]byte, error) {
	if req.CommandID == "" {
		secret := make([]byte, 32)
		rand.Read(secret)
		return secret, nil
	}
	der, err := x509.MarshalPKCS8PrivateKey(s.activeCA().Key)
	if err != nil {
		return nil, api.Errorf(api.CodeInternal, "enrollment grant for node %s: read the CA key: %v", req.NodeID, err)
	}
	key, err := hkdf.Key(sha256.New, der, nil, "kibotos enrollment grant secret v1", 32)
	if err != nil {
		return nil, api.Errorf(api.CodeInternal, "enrollment grant for node %s: derive its secret: %v", req.NodeID, err)
	}
	mac := hmac.New(sha256.New, key)
	in, _ := json.Marshal([]any{req.NodeID, req.CommandID, req.Roles, req.TTL})
	mac.Write(in)
	return mac.Sum(nil), nil
}

// handleJoin admits a host that holds a valid grant and hands it its
// certificates and the cluster's secrets.
func (s *Server) handleJoin(r *http.Request, req api.JoinRequest) response {
	tok, err := parseGrantToken(req.Token)
	if err != nil {
		return fail(err)
	}
	// A grant names the CA that signed when it was issued: during a
	// rotation either CA (the joining host pins the one it names).
	if !s.roots.TrustsFingerprint(tok.CA) {
		return fail(api.Errorf(api.CodeUnauthenticated, "the enrollment grant for node %s belongs to another cluster", tok.NodeID))
	}
	// The host goes into the member certificate signed below.
	if err := api.ValidAdvertise(req.Advertise); err != nil {
		return fail(err)
	}
	host, _, _ := net.SplitHostPort(req.Advertise)
	memberPub, err1 := trust.ParsePublicKeyPEM(req.MemberKey)
	adminPub, err2 := trust.ParsePublicKeyPEM(req.AdminKey)
	if err1 != nil || err2 != nil {
		return fail(api.Errorf(api.CodeInvalidArgument, "join of node %s: public keys are not valid ECDSA PEM keys", tok.NodeID))
	}
	// The admission is a command named by the join's secret, which ctrl
	// replays to the host that sends the same join again (its answer was
	// lost with a leader) and to no one else: the secret is the joining
	// host's alone, and only its digest is stored.
	var command string
	if req.JoinSecret != "" {
		if b, err := hex.DecodeString(req.JoinSecret); err != nil || len(b) != 32 {
			return fail(api.Errorf(api.CodeInvalidArgument, "join of node %s: join_secret must be 64 hexadecimal digits", tok.NodeID))
		}
		command = joinCommandID(tok.NodeID, req.JoinSecret, req.MemberKey, req.AdminKey)
	}
	// The grant is checked against the local state before anything is
	// signed or proposed: a guessed or replayed grant costs one lookup.
	// One used from this join's address goes on when the join carries a
	// secret: the FSM replays its admission or refuses it.
	hash := secretHash(tok.Secret)
	if err := s.fsm.View(func(tx *bolt.Tx) error {
		if err := fsm.CheckGrant(tx, tok.NodeID, hash, time.Now()); err != nil && (command == "" || !fsm.GrantUsedBy(tx, tok.NodeID, hash, req.Advertise)) {
			return err
		}
		return nil
	}); err != nil {
		return fail(err)
	}
	if err := s.checkAdvertiseHost(tok.NodeID, host); err != nil {
		return fail(err)
	}
	args, _ := json.Marshal(fsm.ConsumeArgs{NodeID: tok.NodeID, SecretHash: hash, Address: req.Advertise})
	res, err := s.Apply(r.Context(), fsm.Entry{Op: fsm.OpEnrollmentConsume, Args: args, Actor: "member:" + s.id.NodeID, CommandID: command})
	if err != nil {
		return fail(err)
	}
	if res.Error != nil {
		return fail(res.Error)
	}
	var n api.Node
	if err := json.Unmarshal(res.Value, &n); err != nil {
		return fail(err)
	}
	// The certificates name the admission just recorded, so certificates
	// of an earlier admission of the same node id stay refused.
	member := trust.Identity{ClusterID: s.id.ClusterID, Kind: trust.KindMember, NodeID: n.NodeID, Roles: n.Roles, Admitted: n.AdmittedAt}
	ca := s.signingCA()
	memberCert, err := ca.Issue(member, []string{host}, memberPub, s.lifetime(trust.MemberLifetime))
	if err != nil {
		return fail(err)
	}
	out := api.JoinResponse{
		ClusterID: s.id.ClusterID, NodeID: n.NodeID, Roles: n.Roles,
		CACert: s.trustedBundle(), MemberCert: string(memberCert) + string(ca.CertPEM),
		GossipKey: s.id.GossipKey, Peers: s.ctrlAddrs(),
	}
	// Only a ctrl host or one admitted as operator gets an operator
	// certificate: on any other, whoever controls the host would control
	// the cluster (issue 44).
	if holdsOperatorCert(n.Roles) {
		admin := trust.Identity{ClusterID: s.id.ClusterID, Kind: trust.KindAdmin, NodeID: n.NodeID, Admitted: n.AdmittedAt}
		adminCert, err := ca.Issue(admin, nil, adminPub, s.lifetime(trust.AdminLifetime))
		if err != nil {
			return fail(err)
		}
		out.AdminCert = string(adminCert)
	}
	if n.HasRole(api.RoleCtrl) {
		// The key of the cluster CA (ca.crt's first): a rotation under
		// way reaches the new member through its replica.
		keyPEM, err := trust.EncodeKey(s.activeCA().Key)
		if err != nil {
			return fail(err)
		}
		out.CAKey = string(keyPEM)
	}
	s.log.Info("node joined", "joined_node_id", n.NodeID, "roles", n.Roles, "address", req.Advertise)
	return answer(out)
}

// joinCommandID names the admission of one join: the node, the secret the
// joining host drew and the keys it made. Only the digest goes to the
// Raft log; the keys are in it so a replay certifies the same ones.
func joinCommandID(nodeID, joinSecret, memberKey, adminKey string) string {
	sum := sha256.Sum256([]byte(joinSecret + "\x00" + memberKey + "\x00" + adminKey))
	return "join/" + nodeID + "/" + hex.EncodeToString(sum[:])
}

// handleAddVoter adds an admitted ctrl member to the Raft group when it
// first serves: adding it at join time would cost quorum until it runs.
func (s *Server) handleAddVoter(r *http.Request, req api.AddVoterRequest) response {
	c := callerOf(r)
	if c.kind != trust.KindMember || !c.id.HasRole(trust.RoleCtrl) || c.id.NodeID != req.NodeID {
		return fail(api.Errorf(api.CodePermissionDenied, "only member %s itself can ask to become a voter", req.NodeID))
	}
	var n *api.Node
	err := s.fsm.View(func(tx *bolt.Tx) error {
		var err error
		n, err = fsm.GetNode(tx, req.NodeID)
		return err
	})
	if err != nil {
		return fail(err)
	}
	if n.Admission != api.Admitted || n.Retired || !n.HasRole(api.RoleCtrl) {
		return fail(api.Errorf(api.CodeFailedPrecondition, "node %s is not an admitted ctrl member", req.NodeID))
	}
	voter := raft.Server{ID: raft.ServerID(req.NodeID), Address: raft.ServerAddress(req.Address)}
	var level *MemberLevel // what a new voter answered
	if !s.isVoter(voter.ID) {
		got, err := s.refuseOlderVoter(r.Context(), voter)
		if err != nil {
			return fail(err)
		}
		level = &got
	}
	if err := s.raft.AddVoter(voter.ID, voter.Address, 0, 30*time.Second).Error(); err != nil {
		return fail(api.Errorf(api.CodeUnavailable, "add voter %s: %v", req.NodeID, err))
	}
	s.forgetLevels() // the voters changed
	if level != nil {
		s.recordAnswer(r.Context(), *level)
	}
	return answer(map[string]string{"node_id": req.NodeID, "address": req.Address})
}

// ensureVoter makes a ctrl member that is not yet in the Raft configuration
// ask the leader to add it, retrying until it is in or the member stops.
func (s *Server) ensureVoter() {
	for attempt := 0; ; attempt++ {
		if s.inRaftConfig() {
			return
		}
		if attempt > 0 || len(s.id.Peers) > 0 {
			err := s.askToBeVoter()
			if err == nil {
				return
			}
			if attempt%10 == 1 {
				s.log.Warn("not yet a ctrl voter", "err", err)
			}
		}
		select {
		case <-s.stop:
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (s *Server) inRaftConfig() bool {
	f := s.raft.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	for _, srv := range f.Configuration().Servers {
		if srv.ID == raft.ServerID(s.id.NodeID) {
			return true
		}
	}
	return false
}

// isVoter reports whether id is a voter of the Raft configuration.
func (s *Server) isVoter(id raft.ServerID) bool {
	servers, err := s.raftServers()
	if err != nil {
		return false
	}
	for _, srv := range servers {
		if srv.Voter && srv.ID == string(id) {
			return true
		}
	}
	return false
}

func (s *Server) askToBeVoter() error {
	body, _ := json.Marshal(api.AddVoterRequest{NodeID: s.id.NodeID, Address: s.id.Advertise})
	var lastErr error = errors.New("no ctrl member known")
	for _, addr := range s.ctrlAddrs() {
		if addr == s.id.Advertise {
			continue
		}
		ctx, cancel := context.WithTimeout(s.life, 35*time.Second)
		err := memberCall(ctx, s.memberClient(), addr, "/v1/internal/raft/voter", body, nil)
		cancel()
		if err == nil {
			return nil
		}
		lastErr = err
	}
	return lastErr
}

// memberCall posts body to another member and decodes the result into out
// (may be nil). An unreachable member is unavailable, so callers try the next.
func memberCall(ctx context.Context, c *http.Client, addr, path string, body []byte, out any) error {
	return memberRequest(ctx, c, http.MethodPost, addr, path, body, out)
}

// memberRequest is memberCall with any method (GET: body nil).
func memberRequest(ctx context.Context, c *http.Client, method, addr, path string, body []byte, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, _ := http.NewRequestWithContext(ctx, method, "https://"+addr+path, rd)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	if err != nil {
		return api.Errorf(api.CodeUnavailable, "member %s: %v", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var eb api.ErrorBody
		json.NewDecoder(io.LimitReader(resp.Body, maxBody)).Decode(&eb)
		if eb.Error != nil {
			return eb.Error
		}
		return api.Errorf(api.CodeUnavailable, "member %s answered %s", addr, resp.Status)
	}
	if out == nil {
		return nil
	}
	rb := struct {
		Result any `json:"result"`
	}{Result: out}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxBody)).Decode(&rb); err != nil {
		return fmt.Errorf("member %s: answer does not match this kibotos: %w", addr, err)
	}
	return nil
}
