// The schema's own formats: lb-ipv4 takes dotted-quad IPv4 only.
import t from 'tap';
import { formats } from '../../agent/config/formats';

t.test('lb-ipv4', async (t) => {
  const f = formats['lb-ipv4']!;
  for (const ok of ['10.0.0.1', '0.0.0.0', '255.255.255.255']) t.ok(f(ok), ok);
  for (const bad of ['10.0.0.256', '10.0.0', '10.0.0.1/24', '::1', '', 'a.b.c.d']) t.notOk(f(bad), JSON.stringify(bad));
});
