package cli

import (
	"fmt"

	"github.com/alecthomas/kong"
)

// examples are shown under every verb's --help: what a user types first.
// Keyed by the command's path; a test keeps every verb covered.
var examples = map[string][]string{
	"version": {"kibo version"},
	"init":    {"kibotos init --advertise 10.0.0.1:7400 --node-id ctrl-1"},
	"join": {"kibo enrollment grant node-b --roles node      # on a ctrl member: prints the grant",
		"kibotos join --advertise 10.0.0.2:7400 --grant GRANT 10.0.0.1:7400"},
	"serve":                       {"kibotos serve --config /etc/kibotos/kibotos.toml", "kibotos serve --data-dir /var/lib/kibotos --log-format json"},
	"dev up":                      {"kibotos dev up", "kibotos dev up --advertise 127.0.0.1:7480", "kibotos dev up --log-format json"},
	"dev down":                    {"kibotos dev down", "kibotos dev down --purge"},
	"status":                      {"kibo status"},
	"enrollment grant":            {"kibo enrollment grant node-b --roles node", "kibo enrollment grant ctrl-2 --roles ctrl,node --ttl 1h", "kibo enrollment grant node-c --roles node,operator   # its host may act as operator"},
	"enrollment revoke":           {"kibo enrollment revoke node-b"},
	"enrollment list":             {"kibo enrollment list"},
	"operator issue":              {"kibo operator issue alice --out ./alice       # on a ctrl member: hand ./alice to alice", "kibo operator issue alice --ttl 7d --out ./alice --force"},
	"operator list":               {"kibo operator list"},
	"operator revoke":             {"kibo operator revoke alice"},
	"namespace create":            {"kibo namespace create acme"},
	"namespace list":              {"kibo namespace list"},
	"namespace get":               {"kibo namespace get acme"},
	"namespace delete":            {"kibo namespace delete acme"},
	"namespace set-defaults":      {"kibo namespace set-defaults acme --timeout 1h --max-timeout 24h", "kibo namespace set-defaults acme --timeout 30m --on-timeout pause"},
	"namespace set-quota":         {"kibo namespace set-quota acme --workspaces 20 --cpu 32 --memory 64GiB --volume-bytes 1TiB --snapshot-bytes 100GiB", "kibo namespace set-quota acme --clear memory"},
	"api-key create":              {"kibo api-key create ci --namespace acme --role sandbox --expires 90d", "kibo api-key create acme-admin -n acme --role namespace-admin"},
	"api-key list":                {"kibo api-key list -n acme", "kibo api-key list --all-namespaces"},
	"api-key revoke":              {"kibo api-key revoke ci -n acme"},
	"node list":                   {"kibo node list", "kibo node list --wide"},
	"node get":                    {"kibo node get node-b"},
	"node drain":                  {"kibo node drain node-b", "kibo node drain node-b --wait"},
	"node cancel-drain":           {"kibo node cancel-drain node-b"},
	"node isolate":                {"kibo node isolate node-b    # only once the host is down or cut off from its pools"},
	"node retire":                 {"kibo node retire node-b"},
	"node overcommit get":         {"kibo node overcommit get"},
	"node overcommit set-default": {"kibo node overcommit set-default --cpu 4 --memory 1.2"},
	"node overcommit set":         {"kibo node overcommit set node-b --cpu 2"},
	"ca rotate":                   {"kibo ca rotate"},
	"ca status":                   {"kibo ca status", "kibo ca status --json"},
	"ca finish":                   {"kibo ca finish", "kibo ca finish --force    # members still on the old CA must join again"},
	"platform build":              {"kibo platform build"},
	"platform list":               {"kibo platform list", "kibo platform list --local"},
	"transfer export":             {"kibo transfer export ws-4f2k…", "kibo transfer export ws-4f2k… --namespace team-a --ttl 24h"},
	"transfer get":                {"kibo transfer get tr-7h3q…"},
	"transfer list":               {"kibo transfer list", "kibo transfer list -q"},
	"transfer import":             {"kibo transfer import tr-7h3q…", "kibo transfer import tr-7h3q… --node node-b -q"},
	"transfer delete":             {"kibo transfer delete tr-7h3q…"},
	"artifacts gc":                {"kibo artifacts gc --dry-run", "kibo artifacts gc --older-than 168h -q"},
	"platform publish":            {"kibo platform publish --from-node node-a"},
	"platform approve":            {"kibo platform approve sha256-5f0c…"},
	"platform withdraw":           {"kibo platform withdraw sha256-5f0c…"},
	"template build": {"kibo template build kibotos-coding", "kibo template build debian-12 --debootstrap --suite bookworm --include git,curl",
		"kibo template build e2b-base --debootstrap --include bash,python3,git,curl,ca-certificates --user user --sudo   # E2B-style: execs run as user"},
	"template list":    {"kibo template list", "kibo template list --local"},
	"template publish": {"kibo template publish kibotos-coding", "kibo template publish debian-12 --from-node node-b"},
	"template get":     {"kibo template get kibotos-coding"},
	"template delete":  {"kibo template delete debian-12", "kibo template delete debian-12 --local"},
	"workspace create": {"kibo workspace create --template kibotos-coding --cpu 1 --memory 512MiB",
		"kibo workspace create --template kibotos-coding --cpu 2 --memory 2GiB --egress public --allow '*.github.com,pypi.org'",
		"kibo workspace create --template kibotos-coding --volume data:/data --new-volume 10GiB:/scratch",
		"kibo workspace create --from WS --label fork=1    # fork a PAUSED Workspace (kibo workspace pause WS first)",
		"kibo workspace create --template kibotos-coding --timeout 30m --on-timeout pause --auto-resume",
		"kibo workspace create --template kibotos-coding --idle-timeout 10m --auto-resume    # paused when idle 10m, resumed by the next exec"},
	"volume create":    {"kibo volume create data --size 10GiB", "kibo volume create shared-data --size 100GiB --pool nfs-1"},
	"volume list":      {"kibo volume list", "kibo volume list --pool nfs-1 --wide"},
	"volume get":       {"kibo volume get data"},
	"volume resize":    {"kibo volume resize data --size 20GiB    # online when its Workspace runs"},
	"volume delete":    {"kibo volume delete data"},
	"workspace start":  {"kibo workspace start WS", "kibo workspace start WS --node node-b"},
	"workspace stop":   {"kibo workspace stop WS", "kibo workspace stop WS --force"},
	"workspace delete": {"kibo workspace delete WS"},
	"workspace pause":  {"kibo workspace pause WS"},
	"workspace resume": {"kibo workspace resume WS", "kibo workspace resume WS --node node-b    # a node that reaches the pool"},
	"workspace get":    {"kibo workspace get WS", "kibo workspace get WS --json"},
	"workspace list":   {"kibo workspace list", "kibo workspace list --all --label team=ml"},
	"workspace move":   {"kibo workspace move WS --node node-b"},
	"workspace set-network": {"kibo workspace set-network WS --egress public --deny 10.0.0.0/8",
		"kibo workspace set-network WS --allow '*.example.com' --clear-deny"},
	"workspace cleanup-status": {"kibo workspace cleanup-status WS"},
	"workspace set-timeout": {"kibo workspace set-timeout WS 2h    # ends 2h from now", "kibo workspace set-timeout WS 10m --on-timeout stop",
		"kibo workspace set-timeout WS 0    # no end", "kibo workspace set-timeout WS --idle 10m    # paused when idle 10m; the end stays"},
	"workspace logs":            {"kibo workspace logs WS --tail 50", "kibo workspace logs WS -f", "kibo workspace logs WS --instance inst-... --vmm    # an ended Instance (kibo workspace cleanup-status WS names the latest)"},
	"workspace exec":            {"kibo workspace exec WS -- uname -a", "kibo workspace exec WS -- sh -c 'wget -qO- http://example.com/'"},
	"workspace terminal":        {"kibo workspace terminal WS"},
	"workspace cp":              {"kibo workspace cp ./data.csv WS:/workspace/data.csv", "kibo workspace cp WS:/workspace/out.tar ."},
	"workspace port-forward":    {"kibo workspace port-forward WS 8080", "kibo workspace port-forward WS 9000:8080"},
	"egress create":             {"kibo egress create corp --socks5 proxy.corp:1080 --username kibo --password-file ./pw"},
	"egress update":             {"kibo egress update corp --socks5 proxy2.corp:1080"},
	"egress list":               {"kibo egress list"},
	"egress get":                {"kibo egress get corp"},
	"egress delete":             {"kibo egress delete corp"},
	"resolver create":           {"kibo resolver create corp-dns --upstream 10.0.0.53,dns.corp:5353"},
	"resolver list":             {"kibo resolver list"},
	"resolver get":              {"kibo resolver get corp-dns"},
	"resolver delete":           {"kibo resolver delete corp-dns"},
	"storage-pool list":         {"kibo storage-pool list", "kibo storage-pool list --wide"},
	"storage-pool get":          {"kibo storage-pool get node-a:default"},
	"storage-pool set-capacity": {"kibo storage-pool set-capacity nfs-1 2TiB", "kibo storage-pool set-capacity node-a:default 200GiB --expected-version 3"},
	"check-maintenance": {"kibotos check-maintenance --config /etc/kibotos/kibotos.toml --operation upgrade",
		"kibotos check-maintenance --config /etc/kibotos/kibotos.toml --operation remove"},
	"check-upgrade": {"kibotos check-upgrade --config /etc/kibotos/kibotos.toml --runtime-dir /var/lib/kibotos/storage/installations/sha256-... --preview    # the target build, beside the live node",
		"kibotos check-upgrade --config /etc/kibotos/kibotos.toml --runtime-dir /var/lib/kibotos/storage/installations/sha256-...    # the target build, node stopped"},
	"completion":                {"kibo completion bash    # in ~/.bashrc: source <(kibo completion bash)", "kibo completion fish    # save it as ~/.config/fish/completions/kibo.fish"},
	"storage-pool declare-lost": {"kibo storage-pool declare-lost usb-1 --confirm-data-lost    # only when the disk is gone"},
}

// helpWithExamples is kong's help, then the verb's examples.
func helpWithExamples(options kong.HelpOptions, ctx *kong.Context) error {
	if err := kong.DefaultHelpPrinter(options, ctx); err != nil {
		return err
	}
	n := ctx.Selected()
	if n == nil || len(examples[n.Path()]) == 0 {
		return nil
	}
	fmt.Fprintln(ctx.Stdout, "\nExamples:")
	for _, e := range examples[n.Path()] {
		fmt.Fprintln(ctx.Stdout, "  "+e)
	}
	return nil
}
