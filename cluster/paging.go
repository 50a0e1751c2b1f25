package cluster

import (
	"net/http"
	"strconv"

	"github.com/kibotos/kibotos/api"
)

// maxPageSize bounds ?page_size; 0 (the default) is the whole list.
const maxPageSize = 10000

// pageParams reads ?page_size and ?page_token of a list. A token is the
// name or id a previous page ended with: one line of printable text of at
// most 253 bytes, else it is no token this member handed out.
func pageParams(r *http.Request) (int, string, error) {
	q := r.URL.Query()
	size := 0
	if v := q.Get("page_size"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > maxPageSize {
			return 0, "", api.Errorf(api.CodeInvalidArgument, "page size %s is not valid: give a whole number from 1 to %d, or leave it out for the whole list", api.EscapeText(v), maxPageSize)
		}
		size = n
	}
	token := q.Get("page_token")
	if len(token) > 253 || api.CheckText("page token", token) != nil {
		return 0, "", api.Errorf(api.CodeInvalidArgument, "page token %s is not one this list handed out: pass the next_page_token of the previous page", api.EscapeText(token))
	}
	return size, token, nil
}

// noPaging refuses paging parameters on a list answered whole, instead of
// ignoring them.
func noPaging(r *http.Request, what string) error {
	q := r.URL.Query()
	if q.Has("page_size") || q.Has("page_token") {
		return api.Errorf(api.CodeInvalidArgument, "%s are listed whole, not in pages: leave out page_size and page_token", what)
	}
	return nil
}
