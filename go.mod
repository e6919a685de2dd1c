module github.com/gpumem/tlsf

go 1.26

require (
	github.com/ebitengine/purego v0.11.3 // indirect
	github.com/nlpodyssey/gopickle v0.2.0 // indirect
	github.com/stretchr/testify v1.12.1 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	pgregory.net/rapid v1.3.0 // indirect
)
