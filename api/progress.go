package api

import (
	"fmt"
	"strings"
)

// ByteProgress is how far a node's long byte transfer is: What names it
// ("template publish", "template fetch", "platform fetch", "transfer
// import"); TotalBytes is -1 while unknown.
type ByteProgress struct {
	What       string `json:"what"`
	DoneBytes  int64  `json:"done_bytes"`
	TotalBytes int64  `json:"total_bytes"`
}

// The keys a node lists its transfers under (one at a time per key).
func TemplatePublishProgressKey(name string) string { return "template-publish/" + name }
func PlatformPublishProgressKey(id string) string   { return "platform-publish/" + id }

// WorkspaceProgressKey is what a start of the Workspace fetches or imports.
func WorkspaceProgressKey(id string) string { return "workspace/" + id }

// CheckProgressKey accepts only the keys above, with names that are valid.
func CheckProgressKey(key string) error {
	kind, name, _ := strings.Cut(key, "/")
	var err error
	switch kind {
	case "template-publish":
		err = ValidTemplateName(name)
	case "platform-publish":
		if name != "own" {
			err = ValidPlatformID(name)
		}
	case "workspace":
		if !IsWorkspaceID(name) {
			err = Errorf(CodeInvalidArgument, "%.80q is not a Workspace id", name)
		}
	default:
		err = Errorf(CodeInvalidArgument, "%.80q is not a progress key (template-publish/NAME, platform-publish/ID, workspace/ID)", key)
	}
	if err != nil {
		return fmt.Errorf("progress key: %w", err)
	}
	return nil
}
