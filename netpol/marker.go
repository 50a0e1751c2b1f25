package netpol

import (
	"strconv"
	"strings"

	"github.com/google/nftables/userdata"
)

// layoutVersion is the version of the rule layout this build generates. Bump
// it when the shape of the table changes (a rule added, split, reordered or
// renamed), so a node reading a namespace can tell an older table it may
// regenerate from a newer one it cannot enforce.
const layoutVersion = 1

// markerPrefix starts every comment the node writes on its rules and sets:
// "kibotos:v<layout>:<what>". It is what tells our rules from hand-added
// ones; nft shows it as the rule's comment.
const markerPrefix = "kibotos:v"

// marker is the comment of the rule or set named name in layout version v.
// Rules are named "<chain>/<rule>", sets "set/<set>".
func marker(v int, name string) string {
	return markerPrefix + strconv.Itoa(v) + ":" + name
}

// parseMarker splits a comment written by marker; ok is false for any other
// comment, including none.
func parseMarker(comment string) (version int, name string, ok bool) {
	rest, found := strings.CutPrefix(comment, markerPrefix)
	if !found {
		return 0, "", false
	}
	num, name, found := strings.Cut(rest, ":")
	if !found || name == "" {
		return 0, "", false
	}
	v, err := strconv.Atoi(num)
	if err != nil || v < 0 || strconv.Itoa(v) != num {
		return 0, "", false
	}
	return v, name, true
}

// ruleComment decodes a rule's UserData: the comment, and whether the
// UserData holds exactly that comment and nothing else.
func ruleComment(ud []byte) (comment string, only bool) {
	recs, ok := udataRecords(ud)
	if !ok {
		return "", false
	}
	comment, found := udataString(ud, userdata.TypeComment)
	if !found {
		return "", len(recs) == 0
	}
	return comment, len(recs) == 1 && string(commentUserData(comment)) == string(ud)
}

// udataRecord is one type-length-value record of nft's UserData.
type udataRecord struct {
	typ  userdata.Type
	data []byte
}

// udataRecords splits UserData into records; ok is false when a length
// runs past the end. It parses by hand because userdata.Get trusts the
// lengths and panics on a truncated record, and UserData is anyone's to
// write.
func udataRecords(ud []byte) (recs []udataRecord, ok bool) {
	for len(ud) > 0 {
		if len(ud) < 2 || len(ud) < 2+int(ud[1]) {
			return recs, false
		}
		recs = append(recs, udataRecord{typ: userdata.Type(ud[0]), data: ud[2 : 2+int(ud[1])]})
		ud = ud[2+int(ud[1]):]
	}
	return recs, true
}

// udataString is the first string record of type typ.
func udataString(ud []byte, typ userdata.Type) (string, bool) {
	recs, _ := udataRecords(ud)
	for _, r := range recs {
		if r.typ == typ {
			return strings.TrimSuffix(string(r.data), "\x00"), true
		}
	}
	return "", false
}
