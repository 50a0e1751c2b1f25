package api

import (
	"regexp"
	"time"
)

// Templates in the cluster's catalog: an image a node built, published to
// the artifact store so any node can fetch it by digest.

// ImageFormatExt4 is the format of every template image so far.
const ImageFormatExt4 = "ext4"

// MaxCatalogTemplates bounds the catalog.
const MaxCatalogTemplates = 1024

// MaxNodeTemplateDigests bounds the catalog digests a node reports.
const MaxNodeTemplateDigests = 1024

var (
	templateNamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{0,62}$`)
	templateIDPattern   = regexp.MustCompile(`^sha256-[0-9a-f]{64}$`)
	imageDigestPattern  = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
)

// ValidTemplateName checks a template name.
func ValidTemplateName(name string) error {
	if !templateNamePattern.MatchString(name) {
		return Errorf(CodeInvalidArgument, "template %q is not a valid name: use 1-63 lowercase letters, digits, '.' or '-'; see kibo template list", name)
	}
	return nil
}

// ValidTemplateID checks a template build id (sha256- and 64 hex digits).
func ValidTemplateID(id string) bool { return templateIDPattern.MatchString(id) }

// ValidImageDigest checks an artifact digest (sha256: and 64 hex digits).
func ValidImageDigest(d string) bool { return imageDigestPattern.MatchString(d) }

// TemplateImage is a template's image as put into the artifact store.
type TemplateImage struct {
	Name string `json:"name"`
	// TemplateID is the build's id on the node that published it
	// (sha256- of its content); a node that fetches it keeps it so.
	TemplateID  string `json:"template_id"`
	Digest      string `json:"digest"`
	SizeBytes   int64  `json:"size_bytes"`
	ImageFormat string `json:"image_format"`
}

// CatalogTemplate is one published template.
type CatalogTemplate struct {
	TemplateImage
	PublishedBy string    `json:"published_by"`
	PublishedAt time.Time `json:"published_at"`
	Version     uint64    `json:"version"`
	// Nodes hold a verified copy of the image (their latest reports).
	Nodes []string `json:"nodes"`
}

// CatalogTemplateList is one page of the catalog, by name.
type CatalogTemplateList struct {
	Templates []CatalogTemplate `json:"templates"`
	// NodeTemplates (on the last page) are the templates nodes built
	// themselves that the catalog does not name: placement uses each on
	// the nodes that hold it only. Sorted by name.
	NodeTemplates []NodeTemplate `json:"node_templates,omitempty"`
	NextPageToken string         `json:"next_page_token,omitempty"`
}

// NodeTemplate is a template built on nodes and not published.
type NodeTemplate struct {
	Name  string   `json:"name"`
	Nodes []string `json:"nodes"` // in node id order
}

// TemplatePublishRequest is `template publish`.
type TemplatePublishRequest struct {
	WriteMeta
	// FromNode is the node whose build is published; default: the one
	// node that reports the template.
	FromNode string `json:"from_node,omitempty"`
}
