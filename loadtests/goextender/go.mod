module schedext.io/loadtests/goextender

go 1.22
