package api

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
)

// NewHandlerClient makes a client that calls the API handler h in this
// process with the API key token, as an application's request from
// remote (HOST:PORT) would reach it: a front end that speaks another
// protocol (the E2B API) calls the Kibotos API as its caller's key, so
// the key check, its rules and limits are the API listener's own. With
// no token, h must know the caller itself.
func NewHandlerClient(h http.Handler, token, remote string) *Client {
	c := &Client{Addr: "in-process", token: token, base: "http://in-process"}
	c.once.Do(func() { c.first = &http.Client{Transport: handlerTransport{h: h, remote: remote}} })
	return c
}

// handlerTransport serves each request with h and hands back what it
// wrote.
type handlerTransport struct {
	h      http.Handler
	remote string
}

func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.RemoteAddr = t.remote
	if req.Body == nil {
		req.Body = http.NoBody
	}
	rec := &recorder{header: http.Header{}}
	t.h.ServeHTTP(rec, req)
	status := rec.status
	if status == 0 {
		status = http.StatusOK
	}
	return &http.Response{Status: strconv.Itoa(status) + " " + http.StatusText(status), StatusCode: status, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: rec.header, Body: io.NopCloser(&rec.body), ContentLength: int64(rec.body.Len()), Request: req}, nil
}

// recorder keeps what a handler writes, up to the answer a client reads
// (maxAnswer); beyond, the write fails as a closed connection would.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	if r.body.Len()+len(b) > maxAnswer {
		return 0, io.ErrShortWrite
	}
	return r.body.Write(b)
}
