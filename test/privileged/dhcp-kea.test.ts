// Privileged: the lease lifecycle against ISC Kea, which allows short leases
// (12 s: T1 6 s, T2 10.5 s). A real renewal is seen by Kea (a second row for
// the lease in its memfile, with a later expiry); then Kea is stopped and the
// client goes RENEWING, REBINDING, and withdraws the VIP at expiry with the
// reason; Kea is started again and the client gets its address back.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab, waitFor } from '../../lab/netns';
import { addressesOf, dhcpLab, ping, startDriver, startKea } from './fixtures/dhcp-harness';

if (requirePrivileged(t)) {
  t.test('renewal seen by Kea; RENEWING, REBINDING, expiry while Kea is down; recovery', async (t) => {
    const lab = await createLab(t);
    const { server, agent, client } = await dhcpLab(lab);
    const keaOpts = { pool: '10.99.0.100 - 10.99.0.150', validLifetime: 12 };
    let kea = await startKea(lab, server, keaOpts);
    const d = startDriver(lab, agent, { name: 'web' });
    const vip = ((await d.vip(15_000)).vip as { address: string }).address;
    const bound = d.events.length;

    // T1 = 6 s: a unicast renewal from the VIP, answered by Kea.
    const renewing = await d.dhcpState('RENEWING', 10_000, bound);
    const renewed = await d.dhcpState('BOUND', 5_000, renewing);
    const rows = kea.rows(vip);
    t.ok(rows.length >= 2, `Kea's lease file shows the renewal (${rows.length} rows for ${vip})`);
    t.ok(rows[rows.length - 1]!.expire > rows[0]!.expire, 'with a later expiry');
    t.equal(rows[0]!.hwaddr, d.mac, 'under the service MAC');
    t.equal(rows[0]!.clientId, `01:${d.mac}`, 'and client id');
    t.match(await d.metrics(), /lbagent_dhcp_renewals_total\{service="web",namespace="default"\} [1-9]/);

    // Server gone: RENEWING at T1, REBINDING at T2, VIP withdrawn at expiry.
    await kea.stop();
    const stopped = d.events.length;
    const r2 = await d.dhcpState('RENEWING', 9_000, Math.max(stopped, renewed));
    const rb = await d.dhcpState('REBINDING', 8_000, r2);
    t.ok(r2 < rb, 'RENEWING, then REBINDING');
    t.same(await addressesOf(lab, agent, d.ifname), [`${vip}/32`], 'the VIP is kept while rebinding');
    const lost = await d.next((e) => e.ev === 'lost', 5_000, rb, 'the VIP withdrawn');
    t.match(lost.reason, new RegExp(`^lease of ${vip.replace(/\./g, '\\.')} expired at \\d{4}-\\d\\d-\\d\\dT`), `reason: ${String(lost.reason)}`);
    t.same(await addressesOf(lab, agent, d.ifname), [], 'no address on the macvlan after expiry');
    const m = await d.metrics();
    t.match(m, /lbagent_dhcp_expiries_total\{service="web",namespace="default"\} 1/);
    t.match(m, /lbagent_dhcp_rebinds_total\{service="web",namespace="default"\} [1-9]/);
    t.notMatch(m, /lbagent_dhcp_lease_expiry_timestamp_seconds\{service="web"/, 'no expiry timestamp without a lease');

    // Server back: the client, retransmitting DISCOVERs, gets its address again.
    const before = d.events.length;
    kea = await startKea(lab, server, keaOpts);
    const again = ((await d.vip(15_000, before)).vip as { address: string }).address;
    t.equal(again, vip, 'the same address back (asked for with option 50)');
    t.ok(await waitFor('ping of the VIP', () => ping(lab, client, again), 10_000), 'reachable again');

    d.proc.kill('SIGTERM');
    t.equal((await d.exited).code, 0);
    await kea.stop();
  });
}
