"""Studies made with marlhf, apart from the product's benchmarks (benchmarks/): each a package
holding its code, and one folder per edition with its protocol and its saved runs."""
