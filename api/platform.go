package api

import (
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Platforms in the cluster's catalog: a guest kernel and initramfs (whose
// guest agent is a kibotos executable) that a node built, published to
// the artifact store as an archive of its installation directory. An
// operator approves a Platform; the most recently approved one of each
// kernel series is that series' default, and a node starts new Instances
// only on a default it can drive (once the catalog has an approved
// Platform; before that, each node uses its own build).

// MaxCatalogPlatforms bounds the catalog.
const MaxCatalogPlatforms = 256

var (
	kernelSeriesPattern  = regexp.MustCompile(`^[0-9]{1,3}\.[0-9]{1,4}$`)
	kernelVersionPattern = regexp.MustCompile(`^[0-9]{1,3}\.[0-9]{1,4}[0-9A-Za-z.+~_-]{0,120}$`)
	agentSHAPattern      = regexp.MustCompile(`^[0-9a-f]{64}$`)
	agentReleasePattern  = regexp.MustCompile(`^[0-9A-Za-z.+~_-]{0,64}$`)
)

// ValidPlatformID checks a Platform id (sha256- and 64 hex digits, the
// digest of its content files).
func ValidPlatformID(id string) error {
	if !templateIDPattern.MatchString(id) {
		return Errorf(CodeInvalidArgument, "platform %.80q is not a Platform id (sha256- and 64 hex digits): see kibo platform list", id)
	}
	return nil
}

// KernelSeriesOf is the series (major.minor) of a kernel release such as
// 6.1.0-28-cloud-amd64.
func KernelSeriesOf(kernelVersion string) string {
	parts := strings.SplitN(kernelVersion, ".", 3)
	if len(parts) < 2 {
		return ""
	}
	minor := parts[1]
	if i := strings.IndexFunc(minor, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		minor = minor[:i]
	}
	return parts[0] + "." + minor
}

// PlatformImage is a Platform as put into the artifact store.
type PlatformImage struct {
	PlatformID    string `json:"platform_id"`
	KernelSeries  string `json:"kernel_series"`
	KernelVersion string `json:"kernel_version"`
	// AgentRelease is the kibotos release of its guest agent; "" for an
	// unreleased build, which only nodes running that same executable
	// (AgentSHA256) drive.
	AgentRelease string `json:"agent_release,omitempty"`
	AgentSHA256  string `json:"agent_sha256"`
	// Digest and SizeBytes are the archive's in the artifact store.
	Digest    string `json:"digest"`
	SizeBytes int64  `json:"size_bytes"`
}

// Check validates what a node says it published.
func (p *PlatformImage) Check() error {
	if err := ValidPlatformID(p.PlatformID); err != nil {
		return err
	}
	switch {
	case !kernelVersionPattern.MatchString(p.KernelVersion):
		return Errorf(CodeInvalidArgument, "platform %s: kernel version %.80q is not a kernel release such as 6.1.0-28-cloud-amd64", p.PlatformID, p.KernelVersion)
	case p.KernelSeries != KernelSeriesOf(p.KernelVersion) || !kernelSeriesPattern.MatchString(p.KernelSeries):
		return Errorf(CodeInvalidArgument, "platform %s: kernel series %.20q is not that of kernel %s", p.PlatformID, p.KernelSeries, p.KernelVersion)
	case !agentReleasePattern.MatchString(p.AgentRelease):
		return Errorf(CodeInvalidArgument, "platform %s: agent release %.80q is not a release name", p.PlatformID, p.AgentRelease)
	case !agentSHAPattern.MatchString(p.AgentSHA256):
		return Errorf(CodeInvalidArgument, "platform %s: agent digest %.80q is not 64 hex digits", p.PlatformID, p.AgentSHA256)
	case !ValidImageDigest(p.Digest):
		return Errorf(CodeInvalidArgument, "platform %s: archive digest %.80q is not sha256: and 64 hex digits", p.PlatformID, p.Digest)
	case p.SizeBytes <= 0 || p.SizeBytes > 16<<30:
		return Errorf(CodeInvalidArgument, "platform %s: archive size %d is out of range (1 byte to 16 GiB)", p.PlatformID, p.SizeBytes)
	}
	return nil
}

// Describe is how messages name it: id, series and agent.
func (p *PlatformImage) Describe() string {
	agent := p.AgentRelease
	if agent == "" {
		agent = fmt.Sprintf("unreleased build %.12s", p.AgentSHA256)
	}
	return fmt.Sprintf("%s (kernel series %s, agent %s)", p.PlatformID, p.KernelSeries, agent)
}

// CatalogPlatform is one published Platform.
type CatalogPlatform struct {
	PlatformImage
	PublishedBy string    `json:"published_by"`
	PublishedAt time.Time `json:"published_at"`
	Approved    bool      `json:"approved"`
	// ApprovedAt is when it was approved; nil while it is not.
	ApprovedAt *time.Time `json:"approved_at,omitempty"`
	// Default: the most recently approved Platform of its kernel series.
	Default bool   `json:"default"`
	Version uint64 `json:"version"`
}

// CatalogPlatformList is the Platform catalog, by id.
type CatalogPlatformList struct {
	Platforms     []CatalogPlatform `json:"platforms"`
	NextPageToken string            `json:"next_page_token,omitempty"`
}

// PlatformPublishRequest is `platform publish`.
type PlatformPublishRequest struct {
	WriteMeta
	// FromNode is the node whose Platform is published; default: the only
	// node of the cluster.
	FromNode string `json:"from_node,omitempty"`
	// PlatformID is one of that node's installations; default: its own
	// (the one whose guest agent is its executable).
	PlatformID string `json:"platform_id,omitempty"`
}
