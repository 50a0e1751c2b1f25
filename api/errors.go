// Package api holds the wire types shared by the API server and the CLI:
// error codes and their exit codes, request and response bodies. It has no
// behaviour beyond encoding; it must never import cluster, fsm or cli.
package api

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Code is the machine-readable class of an error. The CLI maps each code to
// one exit code (ExitCode); the table is docs/reference/exit-codes.md.
type Code string

const (
	CodeInternal           Code = "internal"
	CodeAborted            Code = "aborted"
	CodeInvalidArgument    Code = "invalid_argument"
	CodeNotFound           Code = "not_found"
	CodeFailedPrecondition Code = "failed_precondition"
	CodeVersionMismatch    Code = "version_mismatch"
	CodeResourceExhausted  Code = "resource_exhausted"
	CodeDeadlineExceeded   Code = "deadline_exceeded"
	CodeUnavailable        Code = "unavailable"
	CodeUnauthenticated    Code = "unauthenticated"
	CodeAlreadyExists      Code = "already_exists"
	CodePermissionDenied   Code = "permission_denied"
	// CodeTooLarge is a request body over the limit: an invalid argument
	// the HTTP way (413).
	CodeTooLarge Code = "too_large"
)

// Exit codes of the CLI. 0, 2, 12, 13 and 16 are fixed by the product
// documentation; the others are ours and listed in
// docs/reference/exit-codes.md.
const (
	ExitOK                 = 0
	ExitInternal           = 1
	ExitUsage              = 2
	ExitAborted            = 10
	ExitInvalidArgument    = 11
	ExitNotFound           = 12
	ExitFailedPrecondition = 13
	ExitVersionMismatch    = 14
	ExitResourceExhausted  = 15
	ExitTimedOut           = 16
	ExitUnavailable        = 17
	ExitUnauthenticated    = 18
	ExitAlreadyExists      = 19
	ExitPermissionDenied   = 20
)

var codeTable = map[Code]struct {
	exit   int
	status int
}{
	CodeInternal:           {ExitInternal, http.StatusInternalServerError},
	CodeAborted:            {ExitAborted, http.StatusConflict},
	CodeInvalidArgument:    {ExitInvalidArgument, http.StatusBadRequest},
	CodeNotFound:           {ExitNotFound, http.StatusNotFound},
	CodeFailedPrecondition: {ExitFailedPrecondition, http.StatusPreconditionFailed},
	CodeVersionMismatch:    {ExitVersionMismatch, http.StatusConflict},
	CodeResourceExhausted:  {ExitResourceExhausted, http.StatusTooManyRequests},
	CodeDeadlineExceeded:   {ExitTimedOut, http.StatusGatewayTimeout},
	CodeUnavailable:        {ExitUnavailable, http.StatusServiceUnavailable},
	CodeUnauthenticated:    {ExitUnauthenticated, http.StatusUnauthorized},
	CodeAlreadyExists:      {ExitAlreadyExists, http.StatusConflict},
	CodePermissionDenied:   {ExitPermissionDenied, http.StatusForbidden},
	CodeTooLarge:           {ExitInvalidArgument, http.StatusRequestEntityTooLarge},
}

// ExitCode is the CLI exit code for the code; unknown codes are internal.
func (c Code) ExitCode() int {
	if e, ok := codeTable[c]; ok {
		return e.exit
	}
	return ExitInternal
}

// HTTPStatus is the status the API server answers with for the code.
func (c Code) HTTPStatus() int {
	if e, ok := codeTable[c]; ok {
		return e.status
	}
	return http.StatusInternalServerError
}

// Error is the one error shape of the API: a code and a one-line message that
// names the object, what is wrong and what to do.
type Error struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Message }

// Errorf builds an *Error. The message is always one line: arguments are
// often the caller's own input (a command id, a template name), and a line
// break in them must not split the error a CLI prints or a log line.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: oneLine.Replace(fmt.Sprintf(format, args...))}
}

var oneLine = strings.NewReplacer("\r", `\r`, "\n", `\n`)

// CodeOf returns the code carried by err, or CodeInternal.
func CodeOf(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}

// ErrorBody is the JSON body of a failed API call.
type ErrorBody struct {
	Error *Error `json:"error"`
}

// ResultBody is the JSON body of a successful API call and of `--json`.
type ResultBody struct {
	Result any `json:"result"`
	// Replayed is true when a write's --command-id had already been applied
	// and the stored result is returned.
	Replayed bool `json:"replayed,omitempty"`
}

// WriteMeta is carried by every write request.
type WriteMeta struct {
	CommandID       string  `json:"command_id,omitempty"`
	ExpectedVersion *uint64 `json:"expected_version,omitempty"`
	// Generated marks a command id the CLI made up (no --command-id): the
	// write is still idempotent for the CLI's own retries, but the rules for
	// explicit ids (e.g. --expected-version required) do not apply.
	Generated bool `json:"command_id_generated,omitempty"`
}

// Explicit reports whether the operator gave the command id.
func (m WriteMeta) Explicit() bool { return m.CommandID != "" && !m.Generated }
