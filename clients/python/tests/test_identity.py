"""The shared job identity table (tests/fixtures/job_identity/cases.json, also read by the Rust adapters' test
tests/tests/job_identity.rs) against the package's derivation."""

import json
import os
import unittest

import startline

TABLE = os.environ.get("STARTLINE_IDENTITY_TABLE") or os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "tests", "fixtures", "job_identity", "cases.json"
)


class IdentityTable(unittest.TestCase):
    def test_every_case_of_the_shared_table(self) -> None:
        with open(TABLE, encoding="utf-8") as f:
            cases = json.load(f)["cases"]
        self.assertGreaterEqual(len(cases), 15)
        for case in cases:
            with self.subTest(case["name"]):
                job, attempt = startline.job_identity(case["env"])
                self.assertEqual(job, case["job_id"])
                self.assertEqual(attempt, case["attempt"])

    def test_a_reporter_sends_the_derived_id_and_attempt(self) -> None:
        env = {"SLURM_JOB_ID": "44", "SLURM_CLUSTER_NAME": "c1", "SLURM_RESTART_COUNT": "2"}
        r = startline.Reporter(env=env, transport=startline.Transport("agent", url="http://127.0.0.1:9"))
        self.assertEqual((r.job_id, r.attempt), ("slurm/c1/44", 3))
        r.close(0)

    def test_ranks(self) -> None:
        self.assertEqual(startline.global_rank({"RANK": "3", "SLURM_PROCID": "1"}), 3)
        self.assertEqual(startline.global_rank({"SLURM_PROCID": "5", "LOCAL_RANK": "1"}), 5)
        self.assertEqual(startline.global_rank({"LOCAL_RANK": "2"}), 2)
        self.assertEqual(startline.global_rank({}), 0)


if __name__ == "__main__":
    unittest.main()
