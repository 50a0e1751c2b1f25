package guestproto

// ImageConfigPath is where a template built from an OCI image keeps the
// image's exec defaults, inside its root filesystem. The file travels with
// the template's image, so a node that fetches the template from the
// artifact store needs nothing else to run its commands as the image says.
const ImageConfigPath = "/etc/kibotos/image-config.json"

// ImageConfigMax bounds the file: the guest reads no more of it.
const ImageConfigMax = 64 << 10

// ImageConfig is the content of ImageConfigPath: the OCI image config's
// Env, WorkingDir and User, the defaults of an exec under the root.
type ImageConfig struct {
	Env        []string `json:"env"`
	WorkingDir string   `json:"working_dir"`
	// User is the OCI form: uid, uid:gid, name, name:group, uid:group or
	// name:gid, resolved against the root's /etc/passwd and /etc/group.
	User string `json:"user"`
}
