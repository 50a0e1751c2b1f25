package kibotos

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kibotos/kibotos/api"
)

// Code is the machine-readable class of an API error, as the server sends
// it (the codes of the kibo CLI's exit codes, docs/reference/exit-codes.md).
type Code = api.Code

// The codes an *Error carries.
const (
	CodeInternal           = api.CodeInternal
	CodeAborted            = api.CodeAborted
	CodeInvalidArgument    = api.CodeInvalidArgument
	CodeNotFound           = api.CodeNotFound
	CodeFailedPrecondition = api.CodeFailedPrecondition
	CodeVersionMismatch    = api.CodeVersionMismatch
	CodeResourceExhausted  = api.CodeResourceExhausted
	CodeDeadlineExceeded   = api.CodeDeadlineExceeded
	CodeUnavailable        = api.CodeUnavailable
	CodeUnauthenticated    = api.CodeUnauthenticated
	CodeAlreadyExists      = api.CodeAlreadyExists
	CodePermissionDenied   = api.CodePermissionDenied
	CodeTooLarge           = api.CodeTooLarge
)

// Error is every error of a call the server (or this client, checking a
// request before it is sent) refused: its code, and a one-line message
// that names the object, what is wrong and what to do. Test it with
// errors.Is against the Err sentinels, or read Code.
type Error struct {
	Code    Code
	Message string
	// Status is the HTTP status of the answer; 0 when no answer came.
	Status int
	// RateLimited: the API listener refused the call for its key's
	// request rate (429 with Retry-After); nothing was done, and the
	// call may be sent again after RetryAfter.
	RateLimited bool
	RetryAfter  time.Duration
	// Err is the cause of an error of this side (a connection refused, a
	// certificate not trusted); nil for the server's refusals.
	Err error
}

func (e *Error) Error() string {
	if e.Err != nil && e.Message == "" {
		return e.Err.Error()
	}
	return e.Message
}

func (e *Error) Unwrap() error { return e.Err }

// ExitCode is the exit code the kibo CLI gives this error, for programs
// that report failures the way the CLI does.
func (e *Error) ExitCode() int { return e.Code.ExitCode() }

// Is matches the sentinel of the error's class: the codes one exit code
// of the CLI stands for (too_large is an invalid argument), a rate
// limit only ErrRateLimited (a quota refusal, same code, does not).
func (e *Error) Is(target error) bool {
	s, ok := target.(*sentinel)
	if !ok {
		return false
	}
	if s.rateLimited || e.RateLimited {
		return s.rateLimited == e.RateLimited
	}
	return s.code.ExitCode() == e.Code.ExitCode()
}

// sentinel is one class of errors, for errors.Is.
type sentinel struct {
	code        Code
	rateLimited bool
	text        string
}

func (s *sentinel) Error() string { return "kibotos: " + s.text }

// Sentinels, one per class of error (and exit code of the CLI):
// errors.Is(err, kibotos.ErrNotFound).
var (
	ErrInternal           error = &sentinel{code: CodeInternal, text: "internal error"}
	ErrAborted            error = &sentinel{code: CodeAborted, text: "aborted"}
	ErrInvalidArgument    error = &sentinel{code: CodeInvalidArgument, text: "invalid argument"}
	ErrNotFound           error = &sentinel{code: CodeNotFound, text: "not found"}
	ErrFailedPrecondition error = &sentinel{code: CodeFailedPrecondition, text: "failed precondition"}
	ErrVersionMismatch    error = &sentinel{code: CodeVersionMismatch, text: "version mismatch"}
	// ErrResourceExhausted: a namespace quota, or no node with room.
	ErrResourceExhausted error = &sentinel{code: CodeResourceExhausted, text: "resource exhausted"}
	ErrTimedOut          error = &sentinel{code: CodeDeadlineExceeded, text: "timed out"}
	ErrUnavailable       error = &sentinel{code: CodeUnavailable, text: "unavailable"}
	ErrUnauthenticated   error = &sentinel{code: CodeUnauthenticated, text: "unauthenticated"}
	ErrAlreadyExists     error = &sentinel{code: CodeAlreadyExists, text: "already exists"}
	ErrPermissionDenied  error = &sentinel{code: CodePermissionDenied, text: "permission denied"}
	// ErrRateLimited: the key's request rate; retried by the client
	// for as long as its retries and the call's context allow.
	ErrRateLimited error = &sentinel{code: CodeResourceExhausted, rateLimited: true, text: "rate limited"}
)

// ErrQuotaExceeded is ErrResourceExhausted: a quota refusal names the
// quota, what is in use and what was asked.
var ErrQuotaExceeded = ErrResourceExhausted

// errorf is an *Error of this side.
func errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// CodeOf is the code of err: an *Error's, CodeDeadlineExceeded for a
// context's deadline, CodeInternal for anything else (and nil).
func CodeOf(err error) Code {
	var e *Error
	switch {
	case errors.As(err, &e):
		return e.Code
	case errors.Is(err, context.DeadlineExceeded):
		return CodeDeadlineExceeded
	}
	return CodeInternal
}
