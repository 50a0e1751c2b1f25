package e2b

import "time"

// The JSON of E2B's OpenAPI spec (e2b-dev/E2B spec/openapi.yml), the
// fields the SDKs read and send.

// newSandbox is the body of POST /sandboxes and /v2/sandboxes.
type newSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout,omitempty"` // seconds
	AutoPause           *bool             `json:"autoPause,omitempty"`
	AutoPauseMemory     *bool             `json:"autoPauseMemory,omitempty"`
	AutoResume          *autoResume       `json:"autoResume,omitempty"`
	Secure              *bool             `json:"secure,omitempty"`
	AllowInternetAccess *bool             `json:"allow_internet_access,omitempty"`
	Network             *sandboxNetwork   `json:"network,omitempty"`
	Metadata            map[string]string `json:"metadata,omitempty"`
	EnvVars             map[string]string `json:"envVars,omitempty"`
	MCP                 any               `json:"mcp,omitempty"`
	VolumeMounts        []any             `json:"volumeMounts,omitempty"`
	IAM                 any               `json:"iam,omitempty"`
}

type autoResume struct {
	Enabled bool `json:"enabled"`
}

// sandboxNetwork is the network part of a create.
type sandboxNetwork struct {
	AllowOut           []string `json:"allowOut,omitempty"`
	DenyOut            []string `json:"denyOut,omitempty"`
	AllowPublicTraffic *bool    `json:"allowPublicTraffic,omitempty"`
	// Not served, refused when given.
	EgressProxy     any    `json:"egressProxy,omitempty"`
	Rules           any    `json:"rules,omitempty"`
	MaskRequestHost string `json:"maskRequestHost,omitempty"`
	HTTPSPorts      []int  `json:"httpsPorts,omitempty"`
}

// sandbox answers a create, a connect and a resume.
type sandbox struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    *string `json:"envdAccessToken,omitempty"`
	TrafficAccessToken *string `json:"trafficAccessToken,omitempty"`
	Domain             *string `json:"domain,omitempty"`
}

// sandboxDetail answers GET /sandboxes/{id}; listedSandbox is a list's
// item (the same fields but lifecycle and domain).
type sandboxDetail struct {
	listedSandbox
	Domain              *string      `json:"domain,omitempty"`
	Lifecycle           *lifecycle   `json:"lifecycle,omitempty"`
	AllowInternetAccess bool         `json:"allowInternetAccess"`
	Network             *networkInfo `json:"network,omitempty"`
}

// networkInfo is a sandbox's network as GET /sandboxes/{id} shows it.
type networkInfo struct {
	AllowOut           []string `json:"allowOut,omitempty"`
	DenyOut            []string `json:"denyOut,omitempty"`
	AllowPublicTraffic bool     `json:"allowPublicTraffic"`
}

type listedSandbox struct {
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	SandboxID   string            `json:"sandboxID"`
	ClientID    string            `json:"clientID"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int               `json:"memoryMB"`
	DiskSizeMB  int               `json:"diskSizeMB"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	State       string            `json:"state"`
	EnvdVersion string            `json:"envdVersion"`
}

type lifecycle struct {
	OnTimeout  string `json:"onTimeout"` // kill or pause
	AutoResume bool   `json:"autoResume"`
}

// timeoutBody is POST /sandboxes/{id}/timeout's.
type timeoutBody struct {
	Timeout *int64 `json:"timeout"`
}

// pauseBody is POST /sandboxes/{id}/pause's.
type pauseBody struct {
	Memory *bool `json:"memory,omitempty"` // false: the disk only
}

// connectBody is POST /sandboxes/{id}/connect's (and the v1 resume's).
type connectBody struct {
	Timeout *int64 `json:"timeout,omitempty"`
}

// apiError is E2B's error body.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// E2B's sandbox states.
const (
	stateRunning = "running"
	statePaused  = "paused"
)
