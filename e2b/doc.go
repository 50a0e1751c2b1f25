// Package e2b serves E2B's control API (the paths and JSON the official
// E2B SDKs call: create, connect, list, get, kill, timeout, pause) on
// top of the Kibotos API. A request's X-API-Key is a Kibotos API key:
// every call goes through the member's own API, as that key, in this
// process (api.NewHandlerClient), so namespaces, roles, quotas, rate
// limits and audit lines are the API listener's and nothing here
// decides who may do what. A sandbox is a Workspace of the key's
// namespace; its ID is the Workspace's.
package e2b
