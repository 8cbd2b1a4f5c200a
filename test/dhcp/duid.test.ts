// A DHCPv6 service's identity (agent/dhcp/duid.ts): DUID-LL of the service
// MAC, the same on every VM; the IAID its low 32 bits.
import t from 'tap';
import { duidForService, iaidForService } from '../../agent/dhcp/duid';
import { macForService } from '../../agent/net/ownership/ownership';

t.test('DHCPv6 DUID: DUID-LL of the service MAC, the same on every VM; IAID its low 32 bits', async (t) => {
  const duid = duidForService('default/web');
  const mac = macForService('default/web').split(':').join('');
  t.equal(duid.toString('hex'), `00030001${mac}`, 'type 3, hardware type 1 (RFC 8415 §11.4)');
  t.same(duid, duidForService('default/web'), 'stable: no time in it, unlike DUID-LLT');
  t.not(duid.toString('hex'), duidForService('default/api').toString('hex'));
  t.equal(iaidForService('default/web'), parseInt(mac.slice(4), 16));
});
