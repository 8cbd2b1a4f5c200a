// Privileged, through the real agent (kernel data path, SNAT): a connection a
// node forwarded for the Master while it was Backup must not shadow a new
// connection on the same tuple once the node holds the VIP itself.
//
// Found by vrrp-systemd.test.ts failing once in CI (1 failed request on the
// preemption) and reproduced by cycling stop/start 25 times with tcpdump on
// every host: after a VIP moves, a client whose ARP entry still names the
// old holder keeps sending there for a moment, and that node, no longer
// holding the address, routes the packets on to the new holder. conntrack
// records such a flow untranslated (no DNAT: the nat hook only dispatches a
// VIP that is local) and keeps the entry 120 s in SYN_SENT, as it never sees
// the answer. When the client later reuses that source port (seen 4 s
// later) and the node holds the VIP again, the new SYN rides the old entry:
// no DNAT, delivered to the node's own stack, answered with a reset
// (ECONNREFUSED at the client). The agent now deletes the untranslated
// entries to a VIP when the VIP comes onto this node (forward/nft.ts,
// net/conntrack.ts untranslatedTo).
//
// Made on purpose here: the client's neighbour entry for the VIP is pinned
// to the Backup's MAC for one request from a fixed source port, then the
// Master stops (priority 0), the Backup takes the VIP, and the client asks
// again from that port.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { waitFor } from '../../lab/netns';
import { buildVrrpLab, waitMaster, logAfter, POOL_VIP } from '../../lab/vrrp';

const PORT = 47_311;

if (requirePrivileged(t)) {
  t.test('a flow forwarded while Backup does not reset the same tuple after the takeover', async (t) => {
    const { lab, nodes, client } = await buildVrrpLab(t);
    const [, n2, n3] = nodes as [typeof nodes[0], typeof nodes[0], typeof nodes[0]];
    await Promise.all([n2, n3].map((n) => n.start()));
    await waitMaster([n2, n3], n3);
    await n3.waitService('serving', 'api', (s) => s.state === 'serving' && s.vip === POOL_VIP && (s.backends ?? []).every((b) => b.state === 'up'));
    await n2.waitService('ready Backup', 'api', (s) => s.failover?.state === 'backup');

    // One request from the fixed port; the client closes only after the
    // server's FIN, so its side never lingers in TIME_WAIT and the port is
    // free for the second request at once.
    const script = `const s=require('net').connect({host:'${POOL_VIP}',port:80,localPort:${PORT},timeout:2000});let b='';`
      + `s.on('connect',()=>s.write('GET / HTTP/1.0\\r\\n\\r\\n'));s.on('data',(d)=>b+=d);`
      + `s.on('end',()=>process.stdout.write(b.split('\\r\\n\\r\\n')[1]??''));`
      + `s.on('timeout',()=>{process.stdout.write('timeout');s.destroy()});s.on('error',(e)=>process.stdout.write(e.code||e.message));`;
    const get = async (): Promise<string> => (await lab.exec(client, process.execPath, ['-e', script], { allowFail: true })).stdout.trim();
    const n2Mac = (await lab.sh(n2.ns, 'cat /sys/class/net/eth0/address')).stdout.trim();
    await lab.sh(client, `ip neigh replace ${POOL_VIP} lladdr ${n2Mac} dev eth0 nud permanent`);
    const first = await get();
    await lab.sh(client, `ip neigh del ${POOL_VIP} dev eth0`);
    t.match(first, /^b[12]$/, `the first request, sent to n2 and routed on to n3, is served (${first})`);
    const ct = (await lab.sh(n2.ns, `conntrack -L -p tcp --orig-dst ${POOL_VIP} --orig-port-src ${PORT} 2>/dev/null`, { allowFail: true })).stdout;
    const vip = POOL_VIP.replace(/\./g, '\\.');
    t.match(ct, new RegExp(`dst=${vip} sport=${PORT} dport=80 (\\[UNREPLIED\\] )?src=${vip} `), `n2 kept the forwarded flow, untranslated (${ct.trim()})`);

    const since = Date.now();
    n3.agent!.signal('SIGTERM');
    await n3.agent!.exited;
    await n2.waitService('Master holding the VIP', 'api', (s) => s.failover?.state === 'master' && s.vip === POOL_VIP && s.state === 'serving', 5000);
    const ended = await waitFor('n2 ends the untranslated flow', () => logAfter(n2, since, (l) => l['op'] === 'stale-flows'), 5000).catch(() => undefined);
    t.ok(Number(ended?.['ended']) >= 1, `n2 logged: ${String(ended?.['msg'])} (${String(ended?.['ms'])} ms)`);
    t.equal((await lab.sh(n2.ns, `conntrack -L -p tcp --orig-dst ${POOL_VIP} --orig-port-src ${PORT} 2>/dev/null | grep -c 'src=${POOL_VIP} ' || true`, { allowFail: true })).stdout.trim(), '0', 'no untranslated entry for the tuple is left on n2');

    const again = await get();
    t.match(again, /^b[12]$/, `the same client port is served by n2 now, not reset (${again})`);
  });
}
