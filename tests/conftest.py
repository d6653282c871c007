"""Tests mirror the source: tests/<package>/test_<module>.py for operator/shardops/<package>/, and
tests/chart, docs, examples, image, project, testbed and benchmarks for what is not the product.

tests/ and each of its directories are packages, so pytest names every test module by its path
(tests.logic.test_retry, tests.scheduler.test_retry) and two directories may hold a file of the same
name. The kits beside this file (fakekube, fakes3, schedulerkit, workerkit, clikit, logickit,
docskit) are imported the same way: `from tests.fakekube import FakeKube`."""
