"""The reporter's promises, against a scripted receiver: calls never raise, failures are retried with the same
event ids, refusals are dropped and counted, a full queue drops the oldest progress event and never a first step
or a done, only rank 0 reports the first step, the flush is bounded."""

import logging
import os
import time
import unittest

import startline
from receiver import Receiver


def reporter(url: str, **kw) -> startline.Reporter:
    kw.setdefault("max_backoff", 0.1)
    return startline.Reporter("j/1", transport=startline.Transport("agent", url=url, timeout=2.0), env={}, **kw)


class Installed(unittest.TestCase):
    def test_the_package_is_the_installed_wheel(self) -> None:
        expect = os.environ.get("STARTLINE_EXPECT_INSTALLED")
        if expect:
            self.assertTrue(startline.__file__.startswith(expect), startline.__file__)
            self.assertNotIn(os.path.join("clients", "python", "src"), startline.__file__)


class Reporting(unittest.TestCase):
    def test_events_arrive_with_their_fields_and_no_source_for_the_node_agent(self) -> None:
        rx = Receiver([])
        r = reporter(rx.url)
        r.preparing("data_staging")
        r.first_step(1)
        r.first_step(2)  # later calls are no-ops
        with r.saving_checkpoint(100, uri="file:///c/100"):
            time.sleep(0.05)
        r.done("succeeded", exit_code=0)
        self.assertTrue(r.flush(5))
        kinds = [e["kind"] for e in rx.events()]
        self.assertEqual(kinds, ["preparing", "first_step", "checkpoint", "done"])
        ev = {e["kind"]: e for e in rx.events()}
        self.assertEqual(ev["first_step"]["origin"], "training_process")
        self.assertGreaterEqual(ev["checkpoint"]["save_seconds"], 0.05)
        self.assertLess(ev["checkpoint"]["save_seconds"], 2.0)
        self.assertTrue(all("source" not in e and e["job_id"] == "j/1" for e in rx.events()))
        self.assertEqual(len({e["event_id"] for e in rx.events()}), 4)
        self.assertEqual(r.stats()["sent"], 4)
        rx.close()

    def test_failures_are_retried_with_the_same_event_ids(self) -> None:
        rx = Receiver([503, 0 or 500, 429])
        r = reporter(rx.url)
        r.first_step(1)
        self.assertTrue(r.flush(10))
        ids = [b["body"]["events"][0]["event_id"] for b in rx.bodies]
        self.assertEqual(len(ids), 4)
        self.assertEqual(len(set(ids)), 1, "every retry carries the same id")
        self.assertEqual(r.stats()["retries"], 3)
        self.assertEqual(r.stats()["sent"], 1)
        rx.close()

    def test_a_refusal_is_dropped_counted_and_logged_once(self) -> None:
        rx = Receiver([401, 401])
        r = reporter(rx.url)
        with self.assertLogs("startline", level=logging.WARNING) as logs:
            r.checkpoint(1)
            r.flush(5)
            r.checkpoint(2)
            r.flush(5)
        self.assertEqual(r.stats()["refused"], 2)
        self.assertEqual(sum("401" in line for line in logs.output), 1, logs.output)
        rx.close()

    def test_a_400_naming_one_event_drops_only_that_event(self) -> None:
        rx = Receiver([400])
        r = reporter(rx.url, batch_size=10)
        r._wake.clear()
        r.checkpoint(1)
        r.checkpoint(2)
        r.flush(5)
        self.assertEqual(r.stats()["refused"], 1)
        self.assertEqual(len(rx.events()), r.stats()["sent"])
        rx.close()

    def test_bad_arguments_never_raise(self) -> None:
        r = reporter("http://127.0.0.1:9")
        r.checkpoint("not a step")  # type: ignore[arg-type]
        r.preparing("compiling")
        r.done("exploded")
        self.assertEqual(r.stats()["errors"], 3)
        r.close(0)

    def test_the_callers_own_exception_propagates_and_no_save_is_reported(self) -> None:
        r = reporter("http://127.0.0.1:9")
        with self.assertRaises(ZeroDivisionError):
            with r.saving_checkpoint(5):
                1 / 0
        self.assertEqual(r.stats()["queued"], 0)
        r.close(0)


class Threads(unittest.TestCase):
    def test_calls_from_many_threads_get_distinct_ids_and_all_arrive(self) -> None:
        import threading

        rx = Receiver([])
        r = reporter(rx.url)
        threads = [threading.Thread(target=lambda k=k: [r.checkpoint(k * 1000 + i) for i in range(200)]) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertTrue(r.flush(10))
        ids = [e["event_id"] for e in rx.events()]
        self.assertEqual(len(ids), 1600)
        self.assertEqual(len(set(ids)), 1600)
        rx.close()


class Bounds(unittest.TestCase):
    def test_a_full_queue_drops_the_oldest_progress_never_first_step_or_done(self) -> None:
        # Nothing listens on port 9: every send fails and the queue fills.
        r = reporter("http://127.0.0.1:9", queue_size=50, max_backoff=30)
        r.first_step(1)
        for step in range(1, 1001):
            r.checkpoint(step)
        r.done("succeeded")
        s = r.stats()
        self.assertLessEqual(s["pending"], 51)
        self.assertGreaterEqual(s["dropped"], 1000 - 50)
        kinds = [e["kind"] for e in list(r._queue)]
        self.assertIn("first_step", kinds)
        self.assertIn("done", kinds)
        steps = [e["step"] for e in list(r._queue) if e["kind"] == "checkpoint"]
        self.assertEqual(steps[-1], 1000, "the newest progress is kept")
        r.close(0)

    def test_the_flush_is_bounded(self) -> None:
        r = reporter("http://127.0.0.1:9", max_backoff=30)
        r.first_step(1)
        t0 = time.monotonic()
        self.assertFalse(r.flush(0.5))
        self.assertLess(time.monotonic() - t0, 3.0)
        r.close(0)

    def test_only_rank_zero_reports_the_first_step_any_rank_its_checkpoints(self) -> None:
        rx = Receiver([])
        r = reporter(rx.url, rank=3)
        r.first_step(1)
        r.preparing("environment")
        r.checkpoint(10, save_seconds=1.5)
        r.done("succeeded")
        r.flush(5)
        self.assertEqual([e["kind"] for e in rx.events()], ["checkpoint"])
        self.assertEqual(r.stats()["skipped"], 3)
        rx.close()

    def test_rank_from_the_environment(self) -> None:
        r = startline.Reporter("j", env={"RANK": "1"}, transport=startline.Transport("agent", url="http://127.0.0.1:9"))
        self.assertEqual(r.rank, 1)
        r.close(0)


if __name__ == "__main__":
    unittest.main()
