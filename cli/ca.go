package cli

import (
	"fmt"
	"io"

	"github.com/kibotos/kibotos/api"
)

// CACmd rotates the cluster CA (kibo ca rotate, status, finish).
type CACmd struct {
	Rotate CARotateCmd `cmd:"" help:"Begin a CA rotation: ctrl makes a new CA, every member trusts both, then every certificate is reissued under the new one."`
	Status CAStatusCmd `cmd:"" help:"Show the CAs, the rotation's phase and each member's progress."`
	Finish CAFinishCmd `cmd:"" help:"End the rotation: the old CA is trusted nowhere any more."`
}

// CARotateCmd begins a rotation.
type CARotateCmd struct {
	CommandID string `name:"command-id" help:"Idempotency key."`
}

func (c *CARotateCmd) Run(g *Globals) error {
	var out struct {
		Phase     string `json:"phase"`
		StartedBy string `json:"started_by"`
	}
	raw, err := g.call("POST", "/v1/ca/rotate", writeMeta(c.CommandID, nil), &out)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	g.printf("CA rotation begun (phase %s): every member trusts the new CA next, then ctrl signs with it; follow it with kibo ca status\n", out.Phase)
	return nil
}

// CAStatusCmd shows a rotation's progress.
type CAStatusCmd struct{}

func (c *CAStatusCmd) Run(g *Globals) error {
	var st api.CAStatus
	raw, err := g.call("GET", "/v1/ca/status?consistent=true", nil, &st)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	renderCAStatus(g.stdout, st)
	return nil
}

// renderCAStatus writes the CAs, the phase and the members' rows.
func renderCAStatus(w io.Writer, st api.CAStatus) {
	t := newTable(w, "FINGERPRINT", "STATE", "NOT AFTER")
	for _, ca := range st.CAs {
		t.row(ca.Fingerprint, ca.State, stamp(ca.NotAfter))
	}
	t.flush()
	phase := st.Phase
	if phase == "" {
		phase = "none (no rotation under way)"
	}
	fmt.Fprintf(w, "\nPHASE: %s\n\n", api.EscapeText(phase))
	t = newTable(w, "NODE", "TRUSTS NEW", "MEMBER CERT", "DATA PLANE")
	for _, m := range st.Members {
		t.row(m.NodeID, m.TrustsNew, m.MemberCert, dash(m.DataPlane))
	}
	t.flush()
	if len(st.Personal) > 0 {
		fmt.Fprintf(w, "\nOperator credentials issued to persons, to issue again under the new CA:\n")
		for _, p := range st.Personal {
			fmt.Fprintf(w, "  %s\n", api.EscapeText(p))
		}
	}
}

// CAFinishCmd ends a rotation.
type CAFinishCmd struct {
	CommandID string `name:"command-id" help:"Idempotency key."`
	Force     bool   `name:"force" help:"Finish with members still on the old CA: they can no longer authenticate and must join again (kibotos join)."`
}

func (c *CAFinishCmd) Run(g *Globals) error {
	raw, err := g.call("POST", "/v1/ca/finish", api.CAFinishRequest{WriteMeta: writeMeta(c.CommandID, nil), Force: c.Force}, nil)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	g.printf("CA rotation finished: the new CA is the only one trusted\n")
	return nil
}
