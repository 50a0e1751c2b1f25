package cluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/kibotos/kibotos/api"
)

// response is a route's answer as a value: handlers return one and its
// render alone writes status, headers and body, so every route answers
// in the same shapes ({"result": ...} or {"error": ...}).
type response interface {
	render(w http.ResponseWriter)
}

// resultResponse is 200 with {"result": value}; replayed says a write
// was answered from the record of an earlier one with its command id.
type resultResponse struct {
	value    any
	replayed bool
}

func answer(v any) response { return resultResponse{value: v} }

func (a resultResponse) render(w http.ResponseWriter) {
	writeJSON(w, http.StatusOK, api.ResultBody{Result: a.value, Replayed: a.replayed})
}

// errorResponse is {"error": ...} with the status of its code; an error
// that is not an *api.Error is internal.
type errorResponse struct{ err error }

func fail(err error) response { return errorResponse{err: err} }

func (e errorResponse) render(w http.ResponseWriter) { writeError(w, e.err) }

// rawResponse writes its answer itself: a leader's answer passed on, a
// handler of another package (metrics), nothing at all (a client gone).
type rawResponse func(w http.ResponseWriter)

func (f rawResponse) render(w http.ResponseWriter) { f(w) }

// noAnswer writes nothing: the client went away.
var noAnswer = rawResponse(func(http.ResponseWriter) {})

// decoded serves h with the request's body decoded into a T: a body that
// is not one valid T is refused (invalid_argument) before h runs.
func decoded[T any](h func(r *http.Request, body T) response) handler {
	return func(r *http.Request) response {
		var body T
		if err := decodeBody(r, &body); err != nil {
			return fail(err)
		}
		return h(r, body)
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	var e *api.Error
	if !errors.As(err, &e) {
		e = &api.Error{Code: api.CodeInternal, Message: err.Error()}
	}
	writeJSON(w, e.Code.HTTPStatus(), api.ErrorBody{Error: e})
}

func decodeBody(r *http.Request, v any) error {
	// Read to the end: a body cut at the limit would be decoded as what
	// fits (4 MiB of padding before the fields left an empty, unguarded
	// write).
	raw, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return tooLargeError()
		}
		return api.Errorf(api.CodeInvalidArgument, "request body could not be read: %v", err)
	}
	if len(raw) > maxBody {
		return tooLargeError()
	}
	if err := api.CheckJSON(raw); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return api.Errorf(api.CodeInvalidArgument, "request body is not valid: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return api.Errorf(api.CodeInvalidArgument, "request body holds more than one JSON value: send exactly one")
	}
	return nil
}

func tooLargeError() error {
	return api.Errorf(api.CodeTooLarge, "request body is over %d bytes: nothing was done; send a smaller request", maxBody)
}
