"""Puts tests/ on sys.path for every test file, those of tests/<package>/ too (pytest's prepend
import mode adds a conftest's directory): they import the kits (schedulerkit, fakekube) by name, as
the test files beside this one do."""
