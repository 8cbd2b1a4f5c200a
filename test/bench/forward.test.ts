// bench/forward.ts, its pure half: wrk's report and strace's -c summary
// (`--syscalls`, syscalls per request beside HAProxy's; issue 18) read into numbers.
import t from 'tap';
import { parseStraceSummary, parseWrk } from '../../bench/forward';

t.test('strace -c: calls per syscall, failed calls apart, the total row left out', async (t) => {
  const text = [
    '% time     seconds  usecs/call     calls    errors syscall',
    '------ ----------- ----------- --------- --------- ----------------',
    ' 41.20    0.120000           5     24012           write',
    ' 30.02    0.080000           3     24012           read',
    '  9.10    0.020000           1     30351        36 epoll_ctl',
    '  5.00    0.010000           2      6003      6003 connect',
    '  0.00    0.000000           0         2           accept4',
    '------ ----------- ----------- --------- --------- ----------------',
    '100.00    0.230000           2     84380      6039 total',
    '',
  ].join('\n');
  t.same(parseStraceSummary(text), {
    write: 24012, read: 24012, epoll_ctl: 30351, 'epoll_ctl (errors)': 36, connect: 6003, 'connect (errors)': 6003, accept4: 2,
  });
  t.same(parseStraceSummary(''), {}, 'a tracer that saw nothing: no counts');
});

t.test('wrk --latency: rate, percentiles, errors', async (t) => {
  const text = [
    'Running 5s test @ http://10.99.0.50:81/',
    '  1 threads and 50 connections',
    '  Latency Distribution',
    '     50%    1.94ms',
    '     99%   15.56ms',
    '  99735 requests in 5.00s, 80.12MB read',
    '  Socket errors: connect 0, read 2, write 0, timeout 1',
    'Requests/sec:  19947.00',
  ].join('\n');
  t.same(parseWrk(text), { rps: 19947, p50ms: 1.94, p99ms: 15.56, requests: 99735, socketErrors: 3, non2xx: 0 });
});
