// Package guestproto owns the wire protocol between a node and the guest
// agent of a micro-VM: the handshake that picks a protocol version, the yamux
// session over the one byte stream (a virtio-serial port), and the framing
// and messages of every call. It also holds the node-side Client.
//
// The byte stream is not trusted to be clean: bytes written while no peer was
// connected reach the next peer, so both handshake readers skip anything that
// is not a valid, checksummed handshake frame, and the host matches the
// guest's reply by a nonce. Decoding never panics on bad input and every
// length read from the wire is bounded.
//
// This package must never run anything: executing commands, touching files
// and powering off belong to package guest.
package guestproto
